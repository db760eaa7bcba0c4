package httplimit_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testutil"
)

func limiter(t *testing.T, yml string) *sluice.Limiter {
	t.Helper()
	return testutil.Limiter(t, yml, testutil.NewClock())
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	l := limiter(t, `
rules:
  - {name: per-caller, key: [identity], algorithm: fixed_window, limit: 2, period: 1m, soft: 50}
`)
	h := httplimit.New(l).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok"))
	}))
	cases := []struct {
		name    string
		key, ip string
		status  int
		headers map[string]string
	}{
		{"first by key", "k1", "192.0.2.1:1000", 200, map[string]string{
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "60",
			"RateLimit-Policy": `"per-caller";q=2;w=60`, "RateLimit": `"per-caller";r=1;t=60`,
			"X-RateLimit-Warning": `soft limit reached for rule "per-caller"`,
		}},
		{"second by key", "k1", "192.0.2.1:1000", 200, map[string]string{"X-RateLimit-Remaining": "0"}},
		{"third by key is denied", "k1", "192.0.2.9:1000", 429, map[string]string{"Retry-After": "60", "X-RateLimit-Remaining": "0"}},
		{"same IP without a key is another caller", "", "192.0.2.1:1000", 200, map[string]string{"X-RateLimit-Remaining": "1"}},
	}
	for _, c := range cases {
		r := httptest.NewRequest("GET", "/api/x", nil)
		r.RemoteAddr = c.ip
		if c.key != "" {
			r.Header.Set("X-API-Key", c.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
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

func TestMiddlewareFailsOpenOnBadAttributes(t *testing.T) {
	t.Parallel()
	l := limiter(t, "rules:\n  - {name: r, key: [ip], limit: 1, period: 1s}\n")
	reached := false
	h := httplimit.New(l, httplimit.WithClientIPHeader("X-Forwarded-For")).Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		reached = true
	}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "not-an-ip, 10.0.0.1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !reached {
		t.Fatal("a limiter error blocked the request; the default is to let it through")
	}
}
