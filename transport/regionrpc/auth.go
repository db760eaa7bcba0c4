package regionrpc

import (
	"context"
	"crypto/subtle"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// MinTokenLen is the shortest region token New accepts: the token is all that keeps a stranger
// who reaches a node's gRPC port from sending counts or spending home-region quota.
const MinTokenLen = 16

// MinTokenBits is the least entropy New accepts of a region token, as its length times the
// Shannon entropy of its characters: 16 random hex digits hold 64 bits; "aaaaaaaaaaaaaaaa"
// holds none, and a word repeated holds little.
const MinTokenBits = 64

// TokenBits estimates the entropy of tok in bits: its length times the Shannon entropy of its
// characters' frequencies. An estimate from above for a structured secret, but it refuses the
// repeated letters and short alphabets that a person types as a placeholder.
func TokenBits(tok string) float64 {
	counts := map[rune]int{}
	n := 0
	for _, c := range tok {
		counts[c]++
		n++
	}
	var h float64
	for _, k := range counts {
		p := float64(k) / float64(n)
		h -= p * math.Log2(p)
	}
	return h * float64(n)
}

// CheckToken refuses a region token too short or too predictable.
func CheckToken(tok string) error {
	if len(tok) < MinTokenLen {
		return fmt.Errorf("--region-token-file: the region token must hold at least %d characters", MinTokenLen)
	}
	if TokenBits(tok) < MinTokenBits {
		return fmt.Errorf("--region-token-file: the region token is too predictable (about %.0f bits, want %d or more): use a random one, such as 32 hex digits from `openssl rand -hex 16`", TokenBits(tok), MinTokenBits)
	}
	return nil
}

// Failed region authentications are limited per client address (authFailures a minute, then
// a wrong token is refused as too many, as the admin API does), counted through
// Options.OnAuthFailure, and logged at most once per authLogEvery with the number left
// unlogged.
const (
	authFailures   = 10
	authLogEvery   = 10 * time.Second
	maxAuthClients = 10_000
)

// authGuard counts failed region authentications per client address in token buckets of
// authFailures a minute.
type authGuard struct {
	mu      sync.Mutex
	params  algorithm.Params
	clients map[string]*algorithm.State
	lastLog time.Time
	unsaid  int
}

func newAuthGuard() *authGuard {
	p, err := algorithm.NewParams(algorithm.TokenBucket, authFailures, authFailures, time.Minute)
	if err != nil {
		panic(err) // constants
	}
	return &authGuard{params: p, clients: map[string]*algorithm.State{}}
}

// blocked reports whether addr has no failure left at now (µs).
func (g *authGuard) blocked(addr string, now int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.clients[addr]
	if st == nil {
		return false
	}
	return !algorithm.Decide(&g.params, st, now, 1).Allowed
}

// failed takes one failure of addr at now (µs); past maxAuthClients addresses the table starts
// afresh rather than grow.
func (g *authGuard) failed(addr string, now int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.clients[addr]
	if st == nil {
		if len(g.clients) >= maxAuthClients {
			clear(g.clients)
		}
		st = &algorithm.State{}
		g.clients[addr] = st
	}
	if algorithm.Decide(&g.params, st, now, 1).Allowed {
		algorithm.Commit(&g.params, st, now, 1)
	}
}

// errUnauthenticated is all a caller without the region token learns.
var errUnauthenticated = status.Error(codes.Unauthenticated, "unauthenticated")

// tokenCredentials sends the region token with every call to a peer.
type tokenCredentials struct{ header string }

func (c tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": c.header}, nil
}

// RequireTransportSecurity is false so that regions on a private network may link in
// plaintext; --region-ca turns TLS on, and serve warns when the token travels in clear.
func (c tokenCredentials) RequireTransportSecurity() bool { return false }

// errTooManyFailures answers a wrong token from an address past its failures.
var errTooManyFailures = status.Error(codes.ResourceExhausted, "too many failed authentications from this address; retry later")

// authorize checks that the call carries the region token, in constant time. A valid token
// always passes, whatever others sharing the caller's address sent; a wrong one from an
// address past its failures is refused as such (ResourceExhausted). Every failure is counted
// and, at a bounded rate, logged (never with what was sent).
func (t *Transport) authorize(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(t.opts.Token)) == 1 {
			return nil
		}
	}
	var addr string
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		addr, _, _ = net.SplitHostPort(p.Addr.String())
	}
	now := t.opts.Now().UnixMicro()
	if t.guard.blocked(addr, now) {
		t.authFailed(addr, "limited")
		return errTooManyFailures
	}
	t.guard.failed(addr, now)
	t.authFailed(addr, "invalid")
	return errUnauthenticated
}

// authFailed counts a failed region authentication and logs it unless a line was written
// within authLogEvery.
func (t *Transport) authFailed(addr, reason string) {
	if t.opts.OnAuthFailure != nil {
		t.opts.OnAuthFailure(reason)
	}
	g := t.guard
	g.mu.Lock()
	now := time.Now()
	if !g.lastLog.IsZero() && now.Sub(g.lastLog) < authLogEvery {
		g.unsaid++
		g.mu.Unlock()
		return
	}
	unsaid := g.unsaid
	g.lastLog, g.unsaid = now, 0
	g.mu.Unlock()
	t.opts.Log.Warn("region call refused: no valid region token", "client", addr, "reason", reason, "unlogged_before", unsaid)
}
