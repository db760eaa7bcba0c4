package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
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

// post sends body as application/json, as JSON clients do.
func post(s http.Handler, path, body string) *httptest.ResponseRecorder {
	return postAs(s, path, "application/json", body)
}

// postAs sends body with the Content-Type given; "" sends none.
func postAs(s http.Handler, path, contentType, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
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

// TestResetNeedsJSON: a reset must say it is JSON, so that a cross-site HTML form (which can
// only send form, multipart or text/plain bodies without a preflight) cannot post one; checks
// stay lenient, as existing clients post them without a Content-Type.
func TestResetNeedsJSON(t *testing.T) {
	t.Parallel()
	const body = `{"tenant":"t","user":"u","rule":"per-user"}`
	cases := []struct {
		name, contentType string
		want              int
	}{
		{"none", "", 415},
		{"form", "application/x-www-form-urlencoded", 415},
		{"multipart", "multipart/form-data; boundary=x", 415},
		{"text", "text/plain", 415},
		{"text claiming JSON", "text/plain; charset=utf-8; x=application/json", 415},
		{"json suffix", "application/problem+json", 415},
		{"malformed", "application/json; charset", 415},
		{"other charset", "application/json; charset=latin1", 415},
		{"json", "application/json", 200},
		{"json with charset", "application/json; charset=utf-8", 200},
		{"json in capitals", "Application/JSON; Charset=UTF-8", 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			for range 3 {
				postAs(s, "/v1/check", "", `{"tenant":"t","user":"u"}`)
			}
			w := postAs(s, "/v1/reset", c.contentType, body)
			if w.Code != c.want {
				t.Fatalf("status %d, want %d: %s", w.Code, c.want, w.Body)
			}
			remaining := decode(t, post(s, "/v1/quota", `{"tenant":"t","user":"u"}`))["remaining"]
			if c.want != 200 {
				if msg, _ := decode(t, w)["error"].(string); !strings.HasPrefix(msg, "Content-Type: ") {
					t.Fatalf("error %q does not name Content-Type", msg)
				}
				if remaining != 0.0 {
					t.Fatalf("a refused reset reset the key: remaining %v", remaining)
				}
			} else if remaining != 3.0 {
				t.Fatalf("remaining %v after reset, want 3", remaining)
			}
		})
	}
	// Checks and quotas take any Content-Type, or none.
	s := newServer(t)
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		for _, path := range []string{"/v1/check", "/v1/quota"} {
			if w := postAs(s, path, ct, `{"tenant":"t","user":"v"}`); w.Code != 200 {
				t.Errorf("%s with Content-Type %q: %d %s", path, ct, w.Code, w.Body)
			}
		}
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
	cases = append(cases, strictCases...)
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

// strictCases are what a strict JSON reader (a WAF in front, another implementation) refuses
// and a lenient one would quietly take: null for a field, a name given twice (which value
// wins differs between readers), a name in another case, a cost that is not a JSON integer.
var strictCases = []struct {
	name, path, body, want string
}{
	{"null string", "/v1/check", `{"user":null}`, "user: must be a string, not null"},
	{"null tenant", "/v1/check", `{"tenant":null,"user":"u"}`, "tenant: must be a string, not null"},
	{"null idempotency key", "/v1/check", `{"user":"u","idempotency_key":null}`, "idempotency_key: must be a string, not null"},
	{"null cost", "/v1/check", `{"user":"u","cost":null}`, "cost: must be an integer, not null"},
	{"null descriptors", "/v1/check", `{"user":"u","descriptors":null}`, "descriptors: must be an object, not null"},
	{"null descriptor value", "/v1/check", `{"user":"u","descriptors":{"a":null}}`, "descriptors: must be a string, not null"},
	{"null rule in reset", "/v1/reset", `{"user":"u","rule":null}`, "rule: must be a string, not null"},
	{"duplicate field", "/v1/check", `{"user":"a","user":"b"}`, "user: duplicate field"},
	{"duplicate field after others", "/v1/check", `{"user":"a","tenant":"t","cost":1,"cost":2}`, "cost: duplicate field"},
	{"duplicate descriptor", "/v1/check", `{"user":"u","descriptors":{"a":"1","a":"2"}}`, `descriptors: duplicate key "a"`},
	{"duplicate field in reset", "/v1/reset", `{"user":"u","rule":"per-user","rule":"search"}`, "rule: duplicate field"},
	{"upper-case name", "/v1/check", `{"USER":"x"}`, "USER: unknown field"},
	{"mixed-case name", "/v1/check", `{"user":"u","Tenant":"t"}`, "Tenant: unknown field"},
	{"mixed-case name in quota", "/v1/quota", `{"User":"u"}`, "User: unknown field"},
	{"cost with exponent", "/v1/check", `{"user":"u","cost":1e3}`, "cost:"},
	{"cost with fraction zero", "/v1/check", `{"user":"u","cost":1.0}`, "cost:"},
	{"cost as object", "/v1/check", `{"user":"u","cost":{}}`, "cost: must be an integer, not object"},
	{"cost as bool", "/v1/check", `{"user":"u","cost":true}`, "cost: must be an integer"},
	{"trailing garbage", "/v1/check", `{"user":"u"} x`, "body: more than one JSON value"},
	{"top-level null", "/v1/check", `null`, "body: must be an object, not null"},
	{"top-level string", "/v1/check", `"x"`, "body: must be an object, not string"},
	{"descriptors not an object", "/v1/check", `{"user":"u","descriptors":["a"]}`, "descriptors: must be an object"},
	{"nested descriptor", "/v1/check", `{"user":"u","descriptors":{"a":{"b":"c"}}}`, "descriptors: must be a string"},
}

// TestStrictAccepts: strictness refuses only what is ambiguous; the forms a JSON writer
// produces are read as before.
func TestStrictAccepts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		remaining  float64
	}{
		{"plain", `{"tenant":"t","user":"a"}`, 2},
		{"whitespace and escapes", " {\n\t\"tenant\" : \"t\" , \"us\\u0065r\":\"b\"}\n", 2},
		{"explicit cost", `{"tenant":"t","user":"c","cost":2}`, 1},
		{"cost zero looks", `{"tenant":"t","user":"d","cost":0}`, 3},
		{"negative zero cost", `{"tenant":"t","user":"e","cost":-0}`, 3},
		{"empty descriptors", `{"tenant":"t","user":"f","descriptors":{}}`, 2},
		{"descriptors", `{"tenant":"t","user":"g","descriptors":{"a":"1","b":"2"}}`, 2},
		{"empty strings", `{"tenant":"t","user":"h","api_key":"","idempotency_key":""}`, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			w := post(s, "/v1/check", c.body)
			if w.Code != 200 {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := decode(t, w)["remaining"]; got != c.remaining {
				t.Fatalf("remaining %v, want %v", got, c.remaining)
			}
		})
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

func getReady(s http.Handler) (int, map[string]any) {
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	var m map[string]any
	json.Unmarshal(w.Body.Bytes(), &m)
	return w.Code, m
}

// TestReadyReflectsChecks: /readyz is 503 naming the dependency and its error while a required
// check fails, 200 again when it passes, and only reports an optional one. (The store's check
// against a real Redis, killed and restarted, is e2e's TestReadyzFollowsRedis.)
func TestReadyReflectsChecks(t *testing.T) {
	t.Parallel()
	var storeErr, controlErr atomic.Pointer[error]
	check := func(p *atomic.Pointer[error]) func(context.Context) error {
		return func(context.Context) error {
			if err := p.Load(); err != nil {
				return *err
			}
			return nil
		}
	}
	s := New(testutil.Limiter(t, testPolicy, testutil.NewClock()), nil, Options{Ready: []ReadyCheck{
		{Name: "store", Check: check(&storeErr)},
		{Name: "control_store", Check: check(&controlErr), Optional: true},
	}})
	version := s.lim.Policy().Version
	down := errors.New("connection refused")
	cases := []struct {
		name           string
		store, control error
		code           int
		want           map[string]any
	}{
		{"all up", nil, nil, 200, map[string]any{"status": "ready", "store": "up", "control_store": "up", "policy_version": version}},
		{"store down", down, nil, 503, map[string]any{"status": "not ready", "store": "down", "control_store": "up", "error": "store: connection refused", "policy_version": version}},
		{"control store down", nil, down, 200, map[string]any{"status": "ready", "store": "up", "control_store": "down", "error": "control_store: connection refused", "policy_version": version}},
		{"both down", down, down, 503, map[string]any{"status": "not ready", "store": "down", "control_store": "down", "error": "store: connection refused; control_store: connection refused", "policy_version": version}},
		{"back up", nil, nil, 200, map[string]any{"status": "ready", "store": "up", "control_store": "up", "policy_version": version}},
	}
	for _, c := range cases {
		storeErr.Store(&c.store)
		controlErr.Store(&c.control)
		code, body := getReady(s)
		if code != c.code || !maps.Equal(body, c.want) {
			t.Errorf("%s: %d %v, want %d %v", c.name, code, body, c.code, c.want)
		}
	}
}

// TestReadyDoesNotWaitOnAHungCheck: a check that never answers makes /readyz 503 at its
// deadline, and probes that come meanwhile join it rather than start more.
func TestReadyDoesNotWaitOnAHungCheck(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var calls atomic.Int32
	s := New(testutil.Limiter(t, testPolicy, testutil.NewClock()), nil, Options{
		ReadyTimeout: 50 * time.Millisecond,
		Ready: []ReadyCheck{{Name: "store", Check: func(context.Context) error {
			calls.Add(1)
			<-release // ignores its context, as a client stuck on a dead connection may
			return nil
		}}},
	})
	for range 3 {
		code, body := getReady(s)
		if code != 503 || body["store"] != "down" || !strings.Contains(body["error"].(string), "store: no answer within 50ms") {
			t.Fatalf("hung check: %d %v", code, body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d calls of the hung check, want 1", n)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := getReady(s); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready 10 s after the check answered")
		}
		time.Sleep(10 * time.Millisecond)
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

// FuzzStrictDecode: whatever the strict reader accepts, encoding/json accepts too and reads to
// the same values; strictness only ever refuses.
func FuzzStrictDecode(f *testing.F) {
	s := newServer(f)
	for _, seed := range []string{
		`{"tenant":"t","user":"u","endpoint":"/search","cost":2}`,
		`{"descriptors":{"a":"b","c":"\u00e9"},"idempotency_key":"k","user":"x"}`,
		`{"user":null}`, `{"user":"a","user":"b"}`, `{"USER":"a"}`, `{"cost":-0}`, `{"cost":1e2}`,
		`{"us\u0065r":"x"}`, `{"descriptors":{"a":"1","a":"2"}}`, ` {"ip":"::1"} `,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		sc := s.buffers.Get().(*scratch)
		defer s.buffers.Put(sc)
		r := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
		if err := s.decode(httptest.NewRecorder(), r, sc); err != nil {
			if !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("%q: error %v is not a field error", body, err)
			}
			return
		}
		var l struct {
			Tenant         string            `json:"tenant"`
			User           string            `json:"user"`
			APIKey         string            `json:"api_key"`
			IP             string            `json:"ip"`
			Endpoint       string            `json:"endpoint"`
			Method         string            `json:"method"`
			Tier           string            `json:"tier"`
			Descriptors    map[string]string `json:"descriptors"`
			Cost           *int64            `json:"cost"`
			IdempotencyKey string            `json:"idempotency_key"`
			Rule           string            `json:"rule"`
		}
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("strict reader accepted %q, encoding/json refuses it: %v", body, err)
		}
		got := sc.req.request()
		var cost int64
		if l.Cost != nil {
			cost = *l.Cost
		}
		if got.Tenant != l.Tenant || got.User != l.User || got.APIKey != l.APIKey || got.IP != l.IP ||
			got.Endpoint != l.Endpoint || got.Method != l.Method || got.Tier != l.Tier ||
			got.IdempotencyKey != l.IdempotencyKey || string(sc.req.Rule) != l.Rule || got.Cost != cost ||
			sc.req.Cost.set != (l.Cost != nil) || !maps.Equal(got.Descriptors, l.Descriptors) {
			t.Fatalf("%q: strict read %+v, encoding/json %+v", body, sc.req, l)
		}
	})
}
