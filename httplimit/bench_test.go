package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
)

// BenchmarkMiddleware is one allowed request through the middleware on a warm key: identity,
// Check on the memory store, and the rate-limit headers. "peer" is the default; "identity" adds
// an identity function and a forwarded address from a trusted proxy.
func BenchmarkMiddleware(b *testing.B) {
	l := limiter(b, "rules:\n  - {name: per-caller, key: [identity], algorithm: gcra, limit: 1000000000, period: 1s}\n")
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	cases := []struct {
		name string
		opts []httplimit.Option
	}{
		{"peer", nil},
		{"identity", []httplimit.Option{
			httplimit.WithClientIPHeader("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8")),
			httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
				req.User = r.Header.Get("X-Verified-User")
				return nil
			}),
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := httplimit.New(l, c.opts...).Handler(ok)
			r := httptest.NewRequest("GET", "/api/x", nil)
			r.RemoteAddr = "10.0.0.2:1234"
			r.Header.Set("X-Forwarded-For", "198.51.100.7, 10.0.0.3")
			r.Header.Set("X-Verified-User", "john")
			w := testutil.NewDiscardWriter()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				h.ServeHTTP(w, r)
			}
			if w.Code != 0 {
				b.Fatalf("status %d", w.Code)
			}
		})
	}
}
