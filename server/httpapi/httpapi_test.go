package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testutil"
)

const testPolicy = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 3, period: 1m}
  - {name: search, match: {endpoint: /search}, key: [user], algorithm: token_bucket, limit: 10, period: 1s}
`

func newServer(t testing.TB) *Server {
	t.Helper()
	return New(testutil.Limiter(t, testPolicy, testutil.NewClock()), nil, Options{})
}

func post(s http.Handler, path, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

func decode(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return m
}

func TestCheckThenDeny(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	for i := range 4 {
		w := post(s, "/v1/check", `{"tenant":"t","user":"u","endpoint":"/x"}`)
		body := decode(t, w)
		if i < 3 {
			if w.Code != 200 || body["allowed"] != true || body["remaining"] != float64(2-i) {
				t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
			}
			continue
		}
		if w.Code != 429 || body["allowed"] != false || body["rule"] != "per-user" || body["retry_after_ms"] != 60000.0 {
			t.Fatalf("4th: %d %s", w.Code, w.Body)
		}
		if w.Header().Get("Retry-After") != "60" || w.Header().Get("X-RateLimit-Remaining") != "0" || w.Header().Get("RateLimit") == "" {
			t.Fatalf("4th headers: %v", w.Header())
		}
	}
	// Quota looks without consuming; cost 0 on /v1/check does the same.
	for _, path := range []string{"/v1/quota", "/v1/check"} {
		body := `{"tenant":"t","user":"v"}`
		if path == "/v1/check" {
			body = `{"tenant":"t","user":"v","cost":0}`
		}
		for range 2 {
			if got := decode(t, post(s, path, body))["remaining"]; got != 3.0 {
				t.Fatalf("%s remaining %v, want 3", path, got)
			}
		}
	}
	// Two limits: results list both, the tighter decides.
	body := decode(t, post(s, "/v1/check", `{"tenant":"t","user":"w","endpoint":"/search"}`))
	if results := body["results"].([]any); len(results) != 2 || body["rule"] != "per-user" {
		t.Fatalf("results %v rule %v", results, body["rule"])
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	for range 3 {
		post(s, "/v1/check", `{"tenant":"t","user":"u"}`)
	}
	w := post(s, "/v1/reset", `{"tenant":"t","user":"u","rule":"per-user"}`)
	if w.Code != 200 || decode(t, w)["keys_reset"] != 1.0 {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	if got := decode(t, post(s, "/v1/check", `{"tenant":"t","user":"u"}`))["remaining"]; got != 2.0 {
		t.Fatalf("after reset remaining %v, want 2", got)
	}
}

// TestBadInput: each bad request answers 400 with an error naming the problem and consumes
// nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	cases := []struct {
		name, path, body, want string
	}{
		{"malformed JSON", "/v1/check", `{"user":`, "body"},
		{"not an object", "/v1/check", `[1,2]`, "body"},
		{"two values", "/v1/check", `{"user":"u"} {"user":"u"}`, "more than one JSON value"},
		{"empty body", "/v1/check", ``, "body: empty"},
		{"wrong type", "/v1/check", `{"user": 5}`, "user: must be a string"},
		{"cost as string", "/v1/check", `{"user":"u","cost":"2"}`, "cost"},
		{"fractional cost", "/v1/check", `{"user":"u","cost":1.5}`, "cost"},
		{"negative cost", "/v1/check", `{"user":"u","cost":-1}`, "cost: must be >= 0"},
		{"enormous cost", "/v1/check", `{"user":"u","cost":99999999999999999999}`, "cost"},
		{"huge cost", "/v1/check", `{"user":"u","cost":4294967296}`, "cost: must be <="},
		{"unknown field", "/v1/check", `{"user":"u","usr":"x"}`, "usr: unknown field"},
		{"invalid UTF-8", "/v1/check", "{\"user\":\"u\xff\"}", "not valid UTF-8"},
		{"long attribute", "/v1/check", `{"user":"` + strings.Repeat("u", 2000) + `"}`, "user: longer than 1024 bytes"},
		{"bad ip", "/v1/check", `{"user":"u","ip":"999.1.1.1"}`, "ip:"},
		{"oversized body", "/v1/check", `{"user":"` + strings.Repeat("u", 70<<10) + `"}`, "body: larger than"},
		{"descriptors wrong type", "/v1/check", `{"user":"u","descriptors":{"a":1}}`, "descriptors: must be a string"},
		{"unknown rule in reset", "/v1/reset", `{"user":"u","rule":"nope"}`, `rule: no rule named "nope"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := post(s, c.path, c.body)
			if w.Code != 400 {
				t.Fatalf("status %d, want 400: %s", w.Code, w.Body)
			}
			msg, _ := decode(t, w)["error"].(string)
			if !strings.Contains(msg, c.want) {
				t.Fatalf("error %q, want it to contain %q", msg, c.want)
			}
		})
	}
	if got := decode(t, post(s, "/v1/quota", `{"user":"u"}`))["remaining"]; got != 3.0 {
		t.Fatalf("bad input consumed: remaining %v", got)
	}
}

func TestHealthAndReady(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != 200 {
			t.Errorf("%s: %d", path, w.Code)
		}
		if path == "/readyz" && decode(t, w)["policy_version"] == "" {
			t.Errorf("readyz has no policy version: %s", w.Body)
		}
	}
}

// FuzzCheckBody posts arbitrary bodies: the answer is 200, 429 or 400, never a panic or a 5xx.
func FuzzCheckBody(f *testing.F) {
	s := newServer(f)
	for _, seed := range []string{
		`{"tenant":"t","user":"u","endpoint":"/search","cost":2}`,
		`{"descriptors":{"a":"b"},"idempotency_key":"k","user":"x"}`,
		`{"cost":null}`, `{"cost":0}`, "{\"user\":\"\xff\"}", `[]`, ``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		w := post(s, "/v1/check", body)
		if w.Code != 200 && w.Code != 429 && w.Code != 400 {
			t.Fatalf("status %d for %q: %s", w.Code, body, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("invalid JSON answer %q", w.Body)
		}
	})
}

// TestIdempotencyKeyReused: a key reused for another request is 422 naming idempotency_key and
// consumes nothing; the first request's retry still replays.
func TestIdempotencyKeyReused(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	first := `{"tenant":"t","user":"u","endpoint":"/x","idempotency_key":"pay-1"}`
	if w := post(s, "/v1/check", first); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{
		`{"tenant":"t","user":"u","endpoint":"/x","idempotency_key":"pay-1","cost":2}`,
		`{"tenant":"t","user":"u","endpoint":"/search","idempotency_key":"pay-1"}`,
	} {
		w := post(s, "/v1/check", body)
		got := decode(t, w)
		if w.Code != http.StatusUnprocessableEntity || got["field"] != "idempotency_key" || !strings.Contains(got["error"].(string), "idempotency_key") {
			t.Fatalf("reuse %s: %d %s, want 422 naming idempotency_key", body, w.Code, w.Body)
		}
	}
	w := post(s, "/v1/check", first)
	if got := decode(t, w); w.Code != 200 || got["replayed"] != true || got["remaining"] != 2.0 {
		t.Fatalf("retry of the first: %d %s, want a replay with 2 left", w.Code, w.Body)
	}
	if got := decode(t, post(s, "/v1/quota", `{"tenant":"t","user":"u","endpoint":"/search"}`)); got["remaining"] != 2.0 {
		t.Fatalf("after the refused reuses: %v, want 2 left (one request counted)", got)
	}
}
