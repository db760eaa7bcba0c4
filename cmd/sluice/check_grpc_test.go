package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// fixedLimiter answers every Check with its one answer.
type fixedLimiter struct {
	sluicev1.UnimplementedRateLimiterServer
	answer *sluicev1.CheckResponse
}

func (f *fixedLimiter) Check(context.Context, *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	return f.answer, nil
}

// TestGRPCCheckPrintsStableJSON: `sluice check --grpc` prints the answer with one space after
// each colon whatever the build. protojson's own indentation varies between binaries on
// purpose, so the e2e test's `"remaining": "0"` matched one build's output and not another's.
func TestGRPCCheckPrintsStableJSON(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sluicev1.RegisterRateLimiterServer(srv, &fixedLimiter{answer: &sluicev1.CheckResponse{Allowed: false, Limit: 20, Rule: "per-second"}})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	var out strings.Builder
	g := &grpcCheck{addr: ln.Addr().String(), attrs: map[string]*string{}}
	denied, err := g.run(context.Background(), &out)
	if err != nil || !denied {
		t.Fatalf("denied %v, err %v; want a denial", denied, err)
	}
	got := out.String()
	for _, want := range []string{"DENIED (gRPC " + ln.Addr().String() + ")\n{\n", "\n  \"allowed\": false,\n", "\n  \"limit\": \"20\",\n", "\n  \"rule\": \"per-second\",\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
