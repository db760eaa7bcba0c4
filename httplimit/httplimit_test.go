package httplimit_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
)

func limiter(t testing.TB, yml string) *sluice.Limiter {
	t.Helper()
	return testutil.Limiter(t, yml, testutil.NewClock())
}

// next is the wrapped handler: it counts the requests that reach it.
type next struct{ calls atomic.Int64 }

func (n *next) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n.calls.Add(1)
	w.Write([]byte("ok"))
}

// get sends GET path from peer with the given headers through h.
func get(h http.Handler, path, peer string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.URL.Path = path // set after parsing, so a test can send any bytes
	r.RemoteAddr = peer
	for k, vs := range header {
		r.Header[k] = vs
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	l := limiter(t, `
rules:
  - {name: per-caller, key: [identity], algorithm: fixed_window, limit: 2, period: 1m, soft: 50}
`)
	h := httplimit.New(l).Handler(&next{})
	cases := []struct {
		name    string
		peer    string
		status  int
		headers map[string]string
	}{
		{"first from a peer", "192.0.2.1:1000", 200, map[string]string{
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "60",
			"RateLimit-Policy": `"per-caller";q=2;w=60`, "RateLimit": `"per-caller";r=1;t=60`,
			"X-RateLimit-Warning": `soft limit reached for rule "per-caller"`,
		}},
		{"second from the same address, another port", "192.0.2.1:2000", 200, map[string]string{"X-RateLimit-Remaining": "0"}},
		{"third is denied", "192.0.2.1:3000", 429, map[string]string{"Retry-After": "60", "X-RateLimit-Remaining": "0"}},
		{"another peer is another caller", "192.0.2.9:1000", 200, map[string]string{"X-RateLimit-Remaining": "1"}},
		{"IPv6 peer", "[2001:db8::1]:1000", 200, map[string]string{"X-RateLimit-Remaining": "1"}},
	}
	for _, c := range cases {
		w := get(h, "/api/x", c.peer, nil)
		if w.Code != c.status {
			t.Fatalf("%s: status %d, want %d", c.name, w.Code, c.status)
		}
		for k, v := range c.headers {
			if got := w.Header().Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", c.name, k, got, v)
			}
		}
		if c.status == 429 {
			var body map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body["allowed"] != false || body["rule"] != "per-caller" {
				t.Errorf("%s: 429 body %s (%v)", c.name, w.Body.String(), err)
			}
			if w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("429 content type %q", w.Header().Get("Content-Type"))
			}
		}
	}
}

// TestDefaultIgnoresClientHeaders: by default a client that changes its identity headers on
// every request is still one caller, its peer address.
func TestDefaultIgnoresClientHeaders(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, header string
		values       []string
	}{
		{"X-API-Key", "X-Api-Key", []string{"k1", "k2", "k3"}},
		{"X-User-ID", "X-User-Id", []string{"u1", "u2", "u3"}},
		{"X-Tenant-ID", "X-Tenant-Id", []string{"t1", "t2", "t3"}},
		{"X-Forwarded-For", "X-Forwarded-For", []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := limiter(t, "rules:\n  - {name: r, key: [tenant, identity], algorithm: fixed_window, limit: 2, period: 1h}\n")
			n := &next{}
			h := httplimit.New(l).Handler(n)
			var codes []int
			for _, v := range c.values {
				codes = append(codes, get(h, "/", "192.0.2.1:1000", http.Header{c.header: {v}}).Code)
			}
			if fmt.Sprint(codes) != "[200 200 429]" || n.calls.Load() != 2 {
				t.Errorf("statuses %v with %d passed, want [200 200 429]: rotating %s escapes the limit", codes, n.calls.Load(), c.name)
			}
		})
	}
}

// TestExemptKeyHeader: the built-in policy exempts the api key internal-health; sending it in
// a header exempts nobody unless the application says the header is authenticated.
func TestExemptKeyHeader(t *testing.T) {
	t.Parallel()
	builtin, err := os.ReadFile("../node/default-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(builtin), "internal-health") {
		t.Fatal("the built-in policy no longer exempts internal-health; update this test")
	}
	cases := []struct {
		name       string
		opts       []httplimit.Option
		wantDenied bool
	}{
		{"default: the header is not read", nil, true},
		{"identity function that ignores it", []httplimit.Option{httplimit.WithIdentity(func(*http.Request, *sluice.Request) error { return nil })}, true},
		{"opted in: behind a gateway that sets it", []httplimit.Option{httplimit.WithAPIKeyHeader("X-API-Key")}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := httplimit.New(limiter(t, string(builtin)), c.opts...).Handler(&next{})
			denied := false
			// The built-in per-caller limit bursts to 20 and the test clock stands still.
			for range 25 {
				w := get(h, "/", "192.0.2.1:1000", http.Header{"X-Api-Key": {"internal-health"}})
				denied = denied || w.Code == 429
			}
			if denied != c.wantDenied {
				t.Errorf("denied = %v after 25 requests with the exempt key header, want %v", denied, c.wantDenied)
			}
		})
	}
}

// TestInvalidAttributes: an attribute the limiter rejects answers 400 naming the field, the
// request does not pass, nothing is consumed, and nothing above debug is logged.
func TestInvalidAttributes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 2000)
	userFromHeader := httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
		req.User = r.Header.Get("X-User-ID")
		return nil
	})
	cases := []struct {
		name   string
		opts   []httplimit.Option
		path   string
		header http.Header
		status int
		field  string
	}{
		{"2,000-byte user from an identity function", []httplimit.Option{userFromHeader}, "/", http.Header{"X-User-Id": {long}}, 400, "user"},
		{"invalid UTF-8 user from an identity function", []httplimit.Option{userFromHeader}, "/", http.Header{"X-User-Id": {"\xff\xfe"}}, 400, "user"},
		{"2,000-byte api key header, opted in", []httplimit.Option{httplimit.WithAPIKeyHeader("X-API-Key")}, "/", http.Header{"X-Api-Key": {long}}, 400, "api_key"},
		{"invalid UTF-8 tenant header, opted in", []httplimit.Option{httplimit.WithTenantHeader("X-Tenant-ID")}, "/", http.Header{"X-Tenant-Id": {"a\xc3"}}, 400, "tenant"},
		{"2,000-byte path", nil, "/" + long, nil, 400, "endpoint"},
		{"invalid UTF-8 path", nil, "/\xff", nil, 400, "endpoint"},
		{"forwarded address that is not one", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For")}, "/", http.Header{"X-Forwarded-For": {"10.0.0.1, not-an-ip"}}, 400, "ip"},
		{"cost out of range", []httplimit.Option{httplimit.WithIdentity(func(_ *http.Request, req *sluice.Request) error {
			req.Cost = policy.MaxCost + 1
			return nil
		})}, "/", nil, 400, "cost"},
		{"identity function: malformed credential", []httplimit.Option{httplimit.WithIdentity(func(*http.Request, *sluice.Request) error {
			return &policy.FieldError{Field: "authorization", Msg: "not a bearer token"}
		})}, "/", nil, 400, "authorization"},
		{"identity function: unknown credential", []httplimit.Option{httplimit.WithIdentity(func(*http.Request, *sluice.Request) error {
			return errors.New("no such key")
		})}, "/", nil, 401, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := limiter(t, "rules:\n  - {name: r, key: [identity], algorithm: fixed_window, limit: 1, period: 1h}\n")
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
			n := &next{}
			h := httplimit.New(l, append(c.opts, httplimit.WithLogger(log))...).Handler(n)
			for range 3 {
				w := get(h, c.path, "192.0.2.1:1000", c.header)
				if w.Code != c.status {
					t.Fatalf("status %d, want %d; body %s", w.Code, c.status, w.Body.String())
				}
				var body struct{ Error, Field string }
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error == "" || body.Field != c.field {
					t.Errorf("body %s (%v), want an error naming field %q", w.Body.String(), err, c.field)
				}
				if ct := w.Header().Get("Content-Type"); ct != "application/json" {
					t.Errorf("content type %q", ct)
				}
			}
			if n.calls.Load() != 0 {
				t.Errorf("%d refused requests reached the handler", n.calls.Load())
			}
			for line := range strings.Lines(logged.String()) {
				if !strings.Contains(line, "level=DEBUG") {
					t.Errorf("logged above debug: %s", line)
				}
			}
			// Nothing was consumed: the same peer's first valid request passes (its limit is 1).
			if w := get(httplimit.New(l).Handler(n), "/", "192.0.2.1:1000", nil); w.Code != 200 {
				t.Errorf("a valid request after the refused ones: status %d", w.Code)
			}
		})
	}
}

// TestErrorHandler: the application may answer errors its own way, or let requests through.
func TestErrorHandler(t *testing.T) {
	t.Parallel()
	l := limiter(t, "rules:\n  - {name: r, key: [identity], limit: 1, period: 1h}\n")
	var seen []error
	n := &next{}
	h := httplimit.New(l,
		httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
			if r.Header.Get("Authorization") == "" {
				return errors.New("no credential")
			}
			req.User = r.Header.Get("Authorization")
			return nil
		}),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) bool {
			seen = append(seen, err)
			if errors.Is(err, httplimit.ErrIdentity) {
				w.Header().Set("WWW-Authenticate", "Bearer")
			}
			httplimit.WriteError(w, err)
			return false
		}),
	).Handler(n)
	w := get(h, "/", "192.0.2.1:1", nil)
	if w.Code != 401 || w.Header().Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("no credential: %d %v", w.Code, w.Header())
	}
	w = get(h, "/", "192.0.2.1:1", http.Header{"Authorization": {"\xff"}})
	var fe *policy.FieldError
	if w.Code != 400 || len(seen) != 2 || !errors.As(seen[1], &fe) || fe.Field != "user" {
		t.Errorf("bad credential: %d, errors %v", w.Code, seen)
	}

	open := httplimit.New(l, httplimit.WithErrorHandler(func(http.ResponseWriter, *http.Request, error) bool { return true })).Handler(n)
	if w := get(open, "/\xff", "192.0.2.1:1", nil); w.Code != 200 || n.calls.Load() != 1 {
		t.Errorf("an error handler that lets requests through: %d, %d passed", w.Code, n.calls.Load())
	}
}

// TestClientIPHeader: the forwarded address is read only when asked, and taken from the right,
// where trusted proxies write, never from the client-written left.
func TestClientIPHeader(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	cases := []struct {
		name   string
		opts   []httplimit.Option
		peer   string
		header []string
		want   string
	}{
		{"not asked: the peer", nil, "192.0.2.1:1", []string{"203.0.113.9"}, "192.0.2.1"},
		{"no trusted ranges: the right-most entry", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For")}, "192.0.2.1:1", []string{"1.1.1.1, 203.0.113.9"}, "203.0.113.9"},
		{"no trusted ranges, no header: the peer", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For")}, "192.0.2.1:1", nil, "192.0.2.1"},
		{"spoofed left entries skipped", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"1.1.1.1, 203.0.113.9, 10.0.0.5"}, "203.0.113.9"},
		{"untrusted peer: header ignored", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "192.0.2.1:1", []string{"203.0.113.9"}, "192.0.2.1"},
		{"header lines read as one list", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"1.1.1.1", "203.0.113.9, 10.0.0.5"}, "203.0.113.9"},
		{"all hops trusted: the left-most", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"10.0.0.7, 10.0.0.5"}, "10.0.0.7"},
		{"entry with a port", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"203.0.113.9:4711"}, "203.0.113.9"},
		{"IPv6 entry with a port", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"[2001:db8::1]:80, 10.0.0.5"}, "2001:db8::1"},
		{"IPv6 trusted peer", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "[::1]:1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"v4-mapped trusted peer", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "[::ffff:10.0.0.2]:1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"empty entries skipped", []httplimit.Option{httplimit.WithClientIPHeader("X-Forwarded-For", proxies...)}, "10.0.0.2:1", []string{"203.0.113.9, ,"}, "203.0.113.9"},
		{"other header name", []httplimit.Option{httplimit.WithClientIPHeader("x-real-ip", proxies...)}, "10.0.0.2:1", nil, "10.0.0.2"},
		{"peer that is not an address", nil, "@", nil, ""},
	}
	l := limiter(t, "rules: []\n")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var got string
			opts := append(c.opts, httplimit.WithIdentity(func(_ *http.Request, req *sluice.Request) error {
				got = req.IP
				return nil
			}))
			h := httplimit.New(l, opts...).Handler(&next{})
			var header http.Header
			if c.header != nil {
				header = http.Header{"X-Forwarded-For": c.header}
			}
			if w := get(h, "/", c.peer, header); w.Code != 200 {
				t.Fatalf("status %d: %s", w.Code, w.Body.String())
			}
			if got != c.want {
				t.Errorf("ip %q, want %q", got, c.want)
			}
		})
	}
}

// TestPooledRequestIsReset: what one request's identity function set does not leak into the
// next request's attributes through the pool.
func TestPooledRequestIsReset(t *testing.T) {
	l := limiter(t, "rules: []\n")
	var got []sluice.Request
	h := httplimit.New(l, httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
		got = append(got, *req)
		if r.Header.Get("X-Set") != "" {
			req.User, req.Tenant, req.Cost, req.Descriptors = "u", "t", 5, map[string]string{"k": "v"}
		}
		return nil
	})).Handler(&next{})
	for range 50 { // the pool may drop objects; many rounds make reuse near certain
		get(h, "/", "192.0.2.1:1", http.Header{"X-Set": {"1"}})
		get(h, "/", "192.0.2.1:1", nil)
	}
	for i, r := range got {
		if r.User != "" || r.Tenant != "" || r.Cost != 0 || r.Descriptors != nil {
			t.Fatalf("request %d started with %+v", i, r)
		}
	}
}

// An idempotency key reused for another request is the caller's mistake, answered 422 naming
// the key as the servers do, not a 503 that blames the limiter.
func TestIdempotencyKeyReusedIs422(t *testing.T) {
	t.Parallel()
	l := limiter(t, `
rules:
  - {name: per-caller, key: [identity], algorithm: fixed_window, limit: 5, period: 1m}
  - {name: search, match: {endpoint: /search}, key: [identity], algorithm: fixed_window, limit: 5, period: 1m}
`)
	n := &next{}
	h := httplimit.New(l, httplimit.WithIdentity(func(r *http.Request, req *sluice.Request) error {
		req.IdempotencyKey = r.Header.Get("Idempotency-Key")
		return nil
	})).Handler(n)
	key := http.Header{"Idempotency-Key": {"pay-1"}}
	if w := get(h, "/pay", "192.0.2.1:1", key); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := get(h, "/search", "192.0.2.1:1", key)
	var body map[string]string
	json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != http.StatusUnprocessableEntity || body["field"] != "idempotency_key" {
		t.Fatalf("reused key: %d %s, want 422 naming idempotency_key", w.Code, w.Body)
	}
	if n.calls.Load() != 1 {
		t.Fatalf("the refused request reached the handler")
	}
}
