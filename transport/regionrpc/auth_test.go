package regionrpc

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/region"
)

// TestRegionTokenEntropy: New refuses a token too short or too predictable, naming why.
func TestRegionTokenEntropy(t *testing.T) {
	mem := memory.New()
	defer mem.Close()
	r, err := region.New(region.Config{Name: "a"}, mem, mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ token, err string }{
		{"short", "at least 16"},
		{"aaaaaaaaaaaaaaaa", "too predictable"},
		{"abababababababababababab", "too predictable"},
		{"0123456789abcdef", ""},
		{testToken, ""},
	} {
		_, err := New(r, Options{Token: tc.token})
		if tc.err == "" {
			if err != nil {
				t.Errorf("%q: %v, want accepted", tc.token, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), tc.token) {
			t.Errorf("%q: %v, want an error saying %q without the token", tc.token, err, tc.err)
		}
	}
}

// TestRegionAuthFailures: wrong tokens are counted and, past ten a minute from one address,
// refused as too many; the right token from that address still passes; another address is
// not affected; the limit refills with time.
func TestRegionAuthFailures(t *testing.T) {
	mem := memory.New()
	defer mem.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reasons := map[string]int{}
	r, err := region.New(region.Config{Name: "a"}, mem, mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(r, Options{Token: testToken, Now: func() time.Time { return now },
		OnAuthFailure: func(reason string) { reasons[reason]++ }})
	if err != nil {
		t.Fatal(err)
	}
	call := func(addr, token string) codes.Code {
		ctx := grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 4000}})
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
		return status.Code(tr.authorize(ctx))
	}
	for i := range authFailures {
		if got := call("192.0.2.1", "wrong-token-guess-01234"); got != codes.Unauthenticated {
			t.Fatalf("guess %d: %v, want Unauthenticated", i, got)
		}
	}
	if got := call("192.0.2.1", "wrong-token-guess-01234"); got != codes.ResourceExhausted {
		t.Errorf("a guess past the limit: %v, want ResourceExhausted", got)
	}
	if got := call("192.0.2.1", testToken); got != codes.OK {
		t.Errorf("the right token from the guesser's address: %v, want OK", got)
	}
	if got := call("192.0.2.2", "wrong-token-guess-01234"); got != codes.Unauthenticated {
		t.Errorf("another address: %v, want Unauthenticated", got)
	}
	if reasons["invalid"] != authFailures+1 || reasons["limited"] != 1 {
		t.Errorf("failures counted %v, want %d invalid and 1 limited", reasons, authFailures+1)
	}
	now = now.Add(time.Minute)
	if got := call("192.0.2.1", "wrong-token-guess-01234"); got != codes.Unauthenticated {
		t.Errorf("a guess a minute later: %v, want Unauthenticated (the limit refilled)", got)
	}
}
