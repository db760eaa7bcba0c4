// Package overload keeps a saturated Sluice fast: a gate bounds the requests in flight and
// refuses the rest at once (HTTP 503, gRPC RESOURCE_EXHAUSTED) instead of queueing them, so
// latency stays flat and memory bounded; and the admin calls (reset) are rate-limited by a
// Sluice limiter of their own.
package overload

import (
	"context"
	"net"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
)

// Gate admits at most its size of requests at once.
type Gate struct {
	slots    chan struct{}
	onReject func(api string)
}

// NewGate returns a gate of size n; onReject (may be nil) is told of each refusal.
func NewGate(n int, onReject func(api string)) *Gate {
	if onReject == nil {
		onReject = func(string) {}
	}
	return &Gate{slots: make(chan struct{}, n), onReject: onReject}
}

func (g *Gate) enter() bool {
	select {
	case g.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (g *Gate) leave() { <-g.slots }

// HTTP gates the paths of next that decide (/v1/, and /json, Envoy's reference service's
// HTTP form of a decision); health, readiness and metrics always answer.
func (g *Gate) HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") && r.URL.Path != "/json" {
			next.ServeHTTP(w, r)
			return
		}
		if !g.enter() {
			g.onReject("http")
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"overloaded: too many requests in flight; retry shortly"}` + "\n"))
			return
		}
		defer g.leave()
		next.ServeHTTP(w, r)
	})
}

// UnaryInterceptor gates gRPC calls; the health service always answers.
func (g *Gate) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.") {
			return h(ctx, req)
		}
		if !g.enter() {
			g.onReject("grpc")
			return nil, status.Error(codes.ResourceExhausted, "overloaded: too many requests in flight; retry shortly")
		}
		defer g.leave()
		return h(ctx, req)
	}
}

// AdminPolicy limits each client IP's admin calls: 5 a second, bursts of 10.
const AdminPolicy = `
rules:
  - {name: admin, key: [ip], algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
`

// Admin rate-limits the admin calls (POST /v1/reset and sluice.v1 Reset) per client IP with
// lim, a limiter of their own (AdminPolicy over a memory store): a flood of resets cannot eat
// the store's capacity.
type Admin struct{ lim *sluice.Limiter }

// NewAdmin returns the admin limit over lim.
func NewAdmin(lim *sluice.Limiter) *Admin { return &Admin{lim: lim} }

func (a *Admin) allow(ctx context.Context, ip string) bool {
	var d sluice.Decision
	if err := a.lim.Check(ctx, &sluice.Request{IP: ip, Endpoint: "reset"}, &d); err != nil {
		return true // an unknown peer address is no reason to refuse an operator
	}
	return d.Allowed
}

// HTTP limits POST /v1/reset of next.
func (a *Admin) HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/reset" {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			if !a.allow(r.Context(), host) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"error":"too many admin calls; retry shortly"}` + "\n"))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// UnaryInterceptor limits sluice.v1 Reset.
func (a *Admin) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == "/sluice.v1.RateLimiter/Reset" {
			ip := ""
			if p, ok := peer.FromContext(ctx); ok {
				ip, _, _ = net.SplitHostPort(p.Addr.String())
			}
			if !a.allow(ctx, ip) {
				return nil, status.Error(codes.ResourceExhausted, "too many admin calls; retry shortly")
			}
		}
		return h(ctx, req)
	}
}
