package adminapi

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// Errors of Authorize; test with errors.Is.
var (
	// ErrUnauthenticated: no token, or one that no stored token hashes to (HTTP 401, gRPC
	// Unauthenticated). Its message is the same for both, so a caller learns nothing.
	ErrUnauthenticated = errors.New("authentication required: send Authorization: Bearer TOKEN with a valid admin token")
	// ErrForbidden: a valid token of a weaker role than the call needs (HTTP 403, gRPC
	// PermissionDenied).
	ErrForbidden = errors.New("forbidden")
	// ErrTooManyFailures: the client's address failed to authenticate too often lately (HTTP
	// 429, gRPC ResourceExhausted); it is refused, valid token or not, until its limit refills.
	ErrTooManyFailures = errors.New("too many failed authentications from this address; retry later")
)

// limitedError is ErrTooManyFailures with the time until the next attempt is allowed.
type limitedError struct{ retry time.Duration }

func (e *limitedError) Error() string { return ErrTooManyFailures.Error() }
func (e *limitedError) Unwrap() error { return ErrTooManyFailures }

// AuthFailureLimit bounds failed authentications per client address: Max failures, refilled
// over Period (a token bucket), after which the address is refused with 429.
type AuthFailureLimit struct {
	Max    int64
	Period time.Duration
}

// DefaultAuthFailures allows 10 failures a minute per address: plenty for an operator who
// mistypes, and a guesser gets 10 tries a minute at a 256-bit secret.
var DefaultAuthFailures = AuthFailureLimit{Max: 10, Period: time.Minute}

// guard counts failed authentications per client address with Sluice's own limiter over a
// memory store (as transport/overload limits resets): the admin API is rate-limited by the
// product it administers, with no second implementation of a token bucket.
type guard struct {
	lim   *sluice.Limiter
	retry time.Duration // time for one failure to refill
}

func newGuard(l AuthFailureLimit, now func() time.Time) (*guard, error) {
	if l.Max <= 0 {
		l.Max = DefaultAuthFailures.Max
	}
	if l.Period <= 0 {
		l.Period = DefaultAuthFailures.Period
	}
	yml := fmt.Sprintf("rules:\n  - {name: admin-auth-failures, key: [ip], algorithm: token_bucket, limit: %d, period: %s}\n", l.Max, l.Period)
	snap, err := policy.LoadFiles(map[string][]byte{"admin-auth-failures": []byte(yml)})
	if err != nil {
		return nil, fmt.Errorf("adminapi: failed-authentication limit: %w", err)
	}
	st := memory.New(memory.WithClock(func() int64 { return now().UnixMicro() }))
	lim, err := sluice.New(st, snap, sluice.WithClock(now))
	if err != nil {
		return nil, fmt.Errorf("adminapi: failed-authentication limit: %w", err)
	}
	return &guard{lim: lim, retry: l.Period / time.Duration(l.Max)}, nil
}

func (g *guard) close() error { return g.lim.Close() }

// blocked reports whether addr has no failure left. An address the limiter cannot key on (none,
// or not an IP) is never blocked: Sluice's own listeners always give one.
func (g *guard) blocked(ctx context.Context, addr string) error {
	if addr == "" {
		return nil
	}
	var d sluice.Decision
	if err := g.lim.Quota(ctx, &sluice.Request{IP: addr}, &d); err != nil || len(d.Results) == 0 {
		return nil
	}
	if d.Remaining < 1 {
		return &limitedError{retry: max(g.retry, time.Second)}
	}
	return nil
}

// failed counts one failure of addr.
func (g *guard) failed(ctx context.Context, addr string) {
	if addr == "" {
		return
	}
	var d sluice.Decision
	_ = g.lim.Check(ctx, &sluice.Request{IP: addr}, &d) // a refusal is what blocked reads next time
}

// clientKey is the address failures are counted under: the IP itself, or its /64 for IPv6,
// since one IPv6 client holds a whole /64 and could otherwise rotate through it.
func clientKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr().String()
	}
	return a.String()
}

// clientIP is the address failures of r are counted under: its peer's, or, when the peer is
// a trusted proxy, the one that proxy forwarded (X-Forwarded-For).
func (s *Server) clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return s.forwardedFor(host, r.Header.Values("X-Forwarded-For"))
}

// forwardedFor returns the client behind peer: peer itself unless it is a trusted proxy
// (Options.TrustedProxies). Then X-Forwarded-For (xff, every header line, in order) is read
// from its right end, past each address that is a trusted proxy too, to the first that is
// not: the client as the nearest untrusted hop saw it. Anything left of it may be forged by
// the client and is never read; without trusted proxies no header is read at all, since any
// client can write one and would pick a fresh address for every guess.
func (s *Server) forwardedFor(peer string, xff []string) string {
	if !s.trusted(peer) {
		return peer
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := strings.Split(xff[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			hop := strings.TrimSpace(hops[j])
			if _, err := netip.ParseAddr(hop); err != nil {
				return client // a malformed hop ends what can be believed
			}
			client = hop
			if !s.trusted(hop) {
				return client
			}
		}
	}
	return client
}

// trusted reports whether addr is in one of the trusted proxies' ranges.
func (s *Server) trusted(addr string) bool {
	if len(s.opts.TrustedProxies) == 0 {
		return false
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range s.opts.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// bearer returns the token of an Authorization header ("Bearer TOKEN", scheme in any case).
func bearer(header string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// authenticate returns the token that authorization carries. The secret is hashed and looked
// up by its hash (an index match, which reveals nothing of the secret through timing), and the
// hashes are compared again in constant time, so that no path compares secret bytes early-out.
//
// A valid token is never refused for failures: the failure limit is per client address, and
// others sharing an operator's address (a NAT, a proxy) must not lock the operator out. What
// it refuses, once an address used up its failures, is every token that does not match.
func (s *Server) authenticate(ctx context.Context, ip, authorization string) (control.Token, error) {
	secret, ok := bearer(authorization)
	if !ok {
		return control.Token{}, ErrUnauthenticated
	}
	h := control.HashToken(secret)
	tok, err := s.store.TokenByHash(ctx, h)
	switch {
	case errors.Is(err, control.ErrNotFound):
	case err != nil:
		return control.Token{}, fmt.Errorf("authenticate: %w", err)
	case subtle.ConstantTimeCompare(tok.Hash[:], h[:]) == 1 && !tok.Expired(s.now()):
		s.used.note(tok.Name, s.now())
		return tok, nil
	}
	key := clientKey(ip)
	if err := s.guards.blocked(ctx, key); err != nil {
		s.authFailed(ip, failureLimited)
		return control.Token{}, err
	}
	s.guards.failed(ctx, key)
	s.authFailed(ip, failureInvalid)
	return control.Token{}, ErrUnauthenticated
}

// Authorize checks that authorization (an HTTP Authorization header value, or gRPC metadata
// "authorization") carries a token of role need or stronger, for a client at clientIP (failed
// attempts are rate-limited per address). It returns the token, whose Name is the actor to
// audit; errors wrap ErrUnauthenticated, ErrForbidden or ErrTooManyFailures, or are a failure
// of the control store (answer 503 / Unavailable).
func (s *Server) Authorize(ctx context.Context, clientIP, authorization string, need control.Role) (control.Token, error) {
	tok, err := s.authenticate(ctx, clientIP, authorization)
	if err != nil {
		return tok, err
	}
	if !tok.Role.Allows(need) {
		return control.Token{}, fmt.Errorf("%w: this call needs a %s token", ErrForbidden, need)
	}
	return tok, nil
}

// RequireRole returns next behind Authorize: callers without a token of role need get 401,
// 403 or 429 with {"error": "..."}, as the admin API answers. It guards POST /v1/reset
// (httpapi.Options.ResetAuth).
func (s *Server) RequireRole(need control.Role, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.Authorize(r.Context(), s.clientIP(r), r.Header.Get("Authorization"), need); err != nil {
			s.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// GRPCAuth returns a check of a gRPC call's "authorization" metadata for a token of role need,
// answering Unauthenticated, PermissionDenied, ResourceExhausted or Unavailable. It guards
// sluice.v1 Reset (grpcapi.WithResetAuth).
func (s *Server) GRPCAuth(need control.Role) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var header, ip string
		var xff []string
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("authorization"); len(v) > 0 {
			header = v[0]
		}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			ip, _, _ = net.SplitHostPort(p.Addr.String())
			xff = md.Get("x-forwarded-for")
		}
		ip = s.forwardedFor(ip, xff)
		_, err := s.Authorize(ctx, ip, header, need)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrUnauthenticated):
			return status.Error(codes.Unauthenticated, err.Error())
		case errors.Is(err, ErrForbidden):
			return status.Error(codes.PermissionDenied, err.Error())
		case errors.Is(err, ErrTooManyFailures):
			return status.Error(codes.ResourceExhausted, err.Error())
		}
		s.log.Error("authorize gRPC call", "error", err)
		return status.Error(codes.Unavailable, "the control store failed; retry shortly")
	}
}

// NewSecret returns a fresh token secret: 256 random bits, base64url, with a "sluice_" prefix
// that secret scanners and people recognize.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return "sluice_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}
