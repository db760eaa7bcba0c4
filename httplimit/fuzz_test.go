package httplimit_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
)

// FuzzMiddleware: whatever the client sends as path, forwarded addresses and identity header,
// and whatever the peer address looks like, the middleware answers 200, 400 or 429 and never
// panics; a 400 never reaches the handler.
func FuzzMiddleware(f *testing.F) {
	f.Add("/api/x", "192.0.2.1:1", "203.0.113.9, 10.0.0.5", "john")
	f.Add("/\xff", "[::1]:1", "[2001:db8::1]:80,,", "\xff")
	f.Add("/", "@", "not-an-ip", "")
	f.Add("/", "10.0.0.2:1", " , ,10.0.0.9", "internal-health")
	l := limiter(f, "rules:\n  - {name: r, key: [tenant, identity], limit: 5, period: 1h}\nexemptions:\n  - {api_key: internal-health}\n")
	n := &next{}
	h := httplimit.New(l,
		httplimit.WithClientIPHeader("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")),
		httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
			req.User = r.Header.Get("X-User")
			return nil
		}),
	).Handler(n)
	f.Fuzz(func(t *testing.T, path, peer, forwarded, user string) {
		before := n.calls.Load()
		w := get(h, path, peer, http.Header{"X-Forwarded-For": {forwarded}, "X-User": {user}})
		switch w.Code {
		case 200, 429:
		case 400:
			if n.calls.Load() != before {
				t.Fatal("a 400 reached the handler")
			}
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	})
}
