package adminapi_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
)

const domainBody = `{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`

const ruleBody = `{"name":"r1","key":["user"],"algorithm":"token_bucket","limit":10,"period":"1m","tiers":{"free":{"limit":2}},"match":{"endpoint":"/api/*","method":"POST"}}`

// operation is a valid call of one operation of the document.
type operation struct {
	method, template string // as openapi.json names it
	path, body       string
	contentType      string
	role             control.Role
	status           int
}

// seed creates one resource of each kind and returns the valid calls of every operation, in
// an order where each finds what it needs (deletions last).
func seed(e *env) []operation {
	e.t.Helper()
	e.mustCreate("POST", "/admin/v1/rules", ruleBody)
	ov := e.mustCreate("POST", "/admin/v1/overrides", `{"tenant":"acme","type":"ban","ttl":"1h","reason":"abuse"}`)
	ex := e.mustCreate("POST", "/admin/v1/exemptions", `{"ip":"192.168.0.0/16","reason":"office"}`)
	e.mustCreate("PUT", "/admin/v1/identities/api_key/k1", `{"tier":"premium","tenant":"acme"}`)
	e.mustCreate("PUT", "/admin/v1/domains/edge", domainBody)
	if err := e.store.Heartbeat(e.ctx, control.Node{ID: "node-a", Addr: "127.0.0.1:8080", PolicyVersion: 3}); err != nil {
		e.t.Fatal(err)
	}
	ovID := strconv.FormatInt(int64(ov.json["id"].(float64)), 10)
	exID := strconv.FormatInt(int64(ex.json["id"].(float64)), 10)
	read, write, admin := control.RoleRead, control.RoleWrite, control.RoleAdmin
	return []operation{
		{"GET", "/admin/v1/openapi.json", "/admin/v1/openapi.json", "", "", "", 200},
		{"GET", "/admin/v1/rules", "/admin/v1/rules", "", "", read, 200},
		{"POST", "/admin/v1/rules", "/admin/v1/rules", `{"name":"r2","limit":5,"period":"1s"}`, "", write, 201},
		{"GET", "/admin/v1/rules/{name}", "/admin/v1/rules/r1", "", "", read, 200},
		{"PUT", "/admin/v1/rules/{name}", "/admin/v1/rules/r2", `{"limit":6,"period":"1s"}`, "", write, 200},
		{"PATCH", "/admin/v1/rules/{name}", "/admin/v1/rules/r2", `{"limit":7}`, "application/merge-patch+json", write, 200},
		{"GET", "/admin/v1/overrides", "/admin/v1/overrides", "", "", read, 200},
		{"POST", "/admin/v1/overrides", "/admin/v1/overrides", `{"user":"bob","type":"multiplier","value":0.5,"expires_at":"` + e.in(time.Hour) + `","reason":"slow down"}`, "", write, 201},
		{"GET", "/admin/v1/overrides/{id}", "/admin/v1/overrides/" + ovID, "", "", read, 200},
		{"PATCH", "/admin/v1/overrides/{id}", "/admin/v1/overrides/" + ovID, `{"ttl":"2h"}`, "application/merge-patch+json", write, 200},
		{"GET", "/admin/v1/exemptions", "/admin/v1/exemptions", "", "", read, 200},
		{"POST", "/admin/v1/exemptions", "/admin/v1/exemptions", `{"api_key":"partner","reason":"contract"}`, "", write, 201},
		{"GET", "/admin/v1/exemptions/{id}", "/admin/v1/exemptions/" + exID, "", "", read, 200},
		{"PATCH", "/admin/v1/exemptions/{id}", "/admin/v1/exemptions/" + exID, `{"reason":"office wifi","expires_at":null}`, "", write, 200},
		{"GET", "/admin/v1/identities", "/admin/v1/identities", "", "", read, 200},
		{"PUT", "/admin/v1/identities/{kind}/{value}", "/admin/v1/identities/user/alice", `{"tier":"free","trust":0.5}`, "", write, 200},
		{"GET", "/admin/v1/identities/{kind}/{value}", "/admin/v1/identities/api_key/k1", "", "", read, 200},
		{"GET", "/admin/v1/domains", "/admin/v1/domains", "", "", read, 200},
		{"PUT", "/admin/v1/domains/{domain}", "/admin/v1/domains/api", "domain: api\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 7}}]\n", "application/yaml", write, 200},
		{"GET", "/admin/v1/domains/{domain}", "/admin/v1/domains/edge", "", "", read, 200},
		{"GET", "/admin/v1/usage", "/admin/v1/usage?user=alice", "", "", read, 200},
		{"GET", "/admin/v1/usage/history", "/admin/v1/usage/history?step=1h", "", "", read, 200},
		{"GET", "/admin/v1/violations", "/admin/v1/violations?limit=10", "", "", read, 200},
		{"GET", "/admin/v1/audit", "/admin/v1/audit?kind=rule", "", "", read, 200},
		{"GET", "/admin/v1/nodes", "/admin/v1/nodes", "", "", read, 200},
		{"GET", "/admin/v1/stats", "/admin/v1/stats", "", "", read, 200},
		{"GET", "/admin/v1/top", "/admin/v1/top?rule=r1&limit=5", "", "", read, 200},
		{"POST", "/admin/v1/reset", "/admin/v1/reset", `{"user":"alice"}`, "", write, 200},
		{"GET", "/admin/v1/tokens", "/admin/v1/tokens", "", "", admin, 200},
		{"POST", "/admin/v1/tokens", "/admin/v1/tokens", `{"name":"ci","role":"read"}`, "", admin, 201},
		{"DELETE", "/admin/v1/tokens/{name}", "/admin/v1/tokens/ci", "", "", admin, 204},
		{"GET", "/admin/v1/export", "/admin/v1/export", "", "", read, 200},
		{"POST", "/admin/v1/import", "/admin/v1/import?apply=true", `{"identities":[{"kind":"user","value":"imported","tier":"gold"}]}`, "", write, 200},
		{"DELETE", "/admin/v1/identities/{kind}/{value}", "/admin/v1/identities/api_key/k1", "", "", write, 204},
		{"DELETE", "/admin/v1/domains/{domain}", "/admin/v1/domains/api", "", "", write, 204},
		{"DELETE", "/admin/v1/exemptions/{id}", "/admin/v1/exemptions/" + exID, "", "", write, 204},
		{"DELETE", "/admin/v1/overrides/{id}", "/admin/v1/overrides/" + ovID, "", "", write, 204},
		{"DELETE", "/admin/v1/rules/{name}", "/admin/v1/rules/r2", "", "", write, 204},
	}
}

// Every operation of openapi.json answers a valid call with its documented success status,
// and every operation the tests call is in the document.
func TestOpenAPIEveryOperationAnswers(t *testing.T) {
	e := newEnv(t)
	ops := seed(e)
	doc := openAPIDoc(t)
	documented := map[string]int{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			var ok []int
			for code := range op.Responses.Map() {
				if n, _ := strconv.Atoi(code); n >= 200 && n < 300 {
					ok = append(ok, n)
				}
			}
			if len(ok) != 1 {
				t.Errorf("%s %s documents %v as success; want one status", method, path, ok)
				continue
			}
			documented[method+" "+path] = ok[0]
		}
	}
	called := map[string]bool{}
	for _, op := range ops {
		key := op.method + " " + op.template
		called[key] = true
		want, ok := documented[key]
		if !ok {
			t.Errorf("%s is not in openapi.json", key)
			continue
		}
		if want != op.status {
			t.Errorf("%s: the test expects %d, the document %d", key, op.status, want)
		}
		r := e.do(call{method: op.method, path: op.path, role: op.role, body: op.body, contentType: op.contentType})
		if r.status != want {
			t.Errorf("%s %s: %d, want %d: %s", op.method, op.path, r.status, want, r.raw)
		}
		if op.method != "GET" && r.header.Get(adminapi.PolicyVersionHeader) == "" {
			t.Errorf("%s %s: no %s header", op.method, op.path, adminapi.PolicyVersionHeader)
		}
		if r.status != http.StatusNoContent && r.header.Get("ETag") == "" {
			t.Errorf("%s %s: no ETag", op.method, op.path)
		}
	}
	for key := range documented {
		if !called[key] {
			t.Errorf("%s is documented but the test does not call it", key)
		}
	}
}

// The auth matrix: every operation without a token, with an unknown one, and with each role.
func TestAuthMatrix(t *testing.T) {
	e := newEnv(t, func(o *adminapi.Options) { o.AuthFailures = adminapi.AuthFailureLimit{Max: 10000, Period: time.Minute} })
	ops := seed(e)
	rank := map[control.Role]int{control.RoleRead: 1, control.RoleWrite: 2, control.RoleAdmin: 3}
	for _, op := range ops {
		if op.role == "" {
			continue // openapi.json: open to all
		}
		t.Run(op.method+" "+op.template, func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				role  control.Role
				token string
			}{
				{"no token", "", ""},
				{"unknown token", "", "sluice_not-a-token"},
				{"empty bearer", "", " "},
				{"read", control.RoleRead, ""},
				{"write", control.RoleWrite, ""},
				{"admin", control.RoleAdmin, ""},
			} {
				// Allowed calls are sent as HEAD-free reads only for GET; changes are sent with
				// a body that fails validation, so the matrix changes nothing.
				body := op.body
				if op.method != "GET" && body != "" {
					body = `{"bogus_field":1}`
				}
				r := e.do(call{method: op.method, path: op.path, role: tc.role, token: tc.token, body: body, contentType: op.contentType})
				switch {
				case tc.role == "":
					if r.status != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") == "" {
						t.Errorf("%s: %d %s, want 401 with WWW-Authenticate", tc.name, r.status, r.raw)
					}
				case rank[tc.role] < rank[op.role]:
					if r.status != http.StatusForbidden {
						t.Errorf("%s: %d %s, want 403", tc.name, r.status, r.raw)
					}
				default:
					if r.status == http.StatusUnauthorized || r.status == http.StatusForbidden || r.status >= 500 {
						t.Errorf("%s: %d %s, want the call to be let through", tc.name, r.status, r.raw)
					}
				}
			}
		})
	}
	// Unknown paths: an unauthenticated caller learns nothing (401); an authenticated one
	// gets 404, or 405 with Allow for a known path and another method.
	for _, tc := range []struct {
		name, method, path string
		role               control.Role
		want               int
	}{
		{"unknown path, no token", "GET", "/admin/v1/nope", "", 401},
		{"unknown path", "GET", "/admin/v1/nope", control.RoleRead, 404},
		{"empty name", "GET", "/admin/v1/rules/", control.RoleRead, 404},
		{"deeper than any path", "GET", "/admin/v1/rules/r1/extra", control.RoleRead, 404},
		{"HEAD of a list", "HEAD", "/admin/v1/rules", control.RoleRead, 200},
		{"wrong method, no token", "DELETE", "/admin/v1/usage", "", 401},
		{"wrong method", "DELETE", "/admin/v1/usage", control.RoleAdmin, 405},
		{"openapi.json with a token", "GET", "/admin/v1/openapi.json", control.RoleRead, 200},
		{"openapi.json wrong method", "POST", "/admin/v1/openapi.json", "", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(call{method: tc.method, path: tc.path, role: tc.role})
			if r.status != tc.want {
				t.Fatalf("%d %s, want %d", r.status, r.raw, tc.want)
			}
			if tc.want == 405 && r.header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q", r.header.Get("Allow"))
			}
		})
	}
}

// badInput is a write that must be refused with 400 naming field, changing nothing.
type badInput struct {
	name, method, path, body, field string
	header                          map[string]string
}

func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t)
	e.mustCreate("POST", "/admin/v1/rules", ruleBody)
	future := e.in(time.Hour)
	cases := []badInput{
		{"rule unknown field", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","bogus":1}`, "bogus", nil},
		{"rule unknown nested field", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","match":{"path":"/"}}`, "match.path", nil},
		{"rule field in another case", "POST", "/admin/v1/rules", `{"name":"x","Limit":1,"period":"1s"}`, "Limit", nil},
		{"rule duplicate field", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"limit":2,"period":"1s"}`, "limit", nil},
		{"rule limit as string", "POST", "/admin/v1/rules", `{"name":"x","limit":"10","period":"1s"}`, "limit", nil},
		{"rule limit fraction", "POST", "/admin/v1/rules", `{"name":"x","limit":1.5,"period":"1s"}`, "limit", nil},
		{"rule limit zero", "POST", "/admin/v1/rules", `{"name":"x","limit":0,"period":"1s"}`, "limit", nil},
		{"rule bad period", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"soon"}`, "period", nil},
		{"rule period as number", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":60}`, "period", nil},
		{"rule no period", "POST", "/admin/v1/rules", `{"name":"x","limit":1}`, "period", nil},
		{"rule bad algorithm", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","algorithm":"magic"}`, "algorithm", nil},
		{"rule soft above hard", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","soft":100}`, "soft", nil},
		{"rule bad key", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","key":["shoe_size"]}`, "key[0]", nil},
		{"rule bad tier", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","tiers":{"free":{"limit":-1}}}`, "tiers.free.limit", nil},
		{"rule bad on_store_error", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s","on_store_error":"maybe"}`, "on_store_error", nil},
		{"rule no name", "POST", "/admin/v1/rules", `{"limit":1,"period":"1s"}`, "name", nil},
		{"rule name with @", "POST", "/admin/v1/rules", `{"name":"@x","limit":1,"period":"1s"}`, "name", nil},
		{"rule name too long", "POST", "/admin/v1/rules", `{"name":"` + strings.Repeat("n", 129) + `","limit":1,"period":"1s"}`, "name", nil},
		{"rule name with NUL", "POST", "/admin/v1/rules", `{"name":"a\u0000b","limit":1,"period":"1s"}`, "name", nil},
		{"empty body", "POST", "/admin/v1/rules", ` `, "body", nil},
		{"array body", "POST", "/admin/v1/rules", `[]`, "body", nil},
		{"truncated body", "POST", "/admin/v1/rules", `{"name":"x"`, "body", nil},
		{"two values", "POST", "/admin/v1/rules", `{"name":"x","limit":1,"period":"1s"} {}`, "body", nil},
		{"put rule other name", "PUT", "/admin/v1/rules/r1", `{"name":"r9","limit":1,"period":"1s"}`, "name", nil},
		{"put rule bad limit", "PUT", "/admin/v1/rules/r1", `{"limit":-5,"period":"1s"}`, "limit", nil},
		{"put rule bad If-Match", "PUT", "/admin/v1/rules/r1", `{"limit":5,"period":"1s"}`, "If-Match", map[string]string{"If-Match": "12"}},
		{"patch rule bad limit", "PATCH", "/admin/v1/rules/r1", `{"limit":-1}`, "limit", nil},
		{"patch rule wrong type", "PATCH", "/admin/v1/rules/r1", `{"algorithm":5}`, "algorithm", nil},
		{"patch rule unknown field", "PATCH", "/admin/v1/rules/r1", `{"bogus":{"a":1}}`, "bogus", nil},
		{"patch rule removes period", "PATCH", "/admin/v1/rules/r1", `{"period":null}`, "period", nil},
		{"patch rule renames", "PATCH", "/admin/v1/rules/r1", `{"name":"r9"}`, "name", nil},
		{"override no expiry", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r"}`, "expires_at", nil},
		{"override both expiries", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","ttl":"5m","expires_at":"` + future + `"}`, "ttl", nil},
		{"override bad ttl", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","ttl":"five minutes"}`, "ttl", nil},
		{"override negative ttl", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","ttl":"-5m"}`, "ttl", nil},
		{"override past expires_at", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","expires_at":"2020-01-01T00:00:00Z"}`, "expires_at", nil},
		{"override bad expires_at", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","expires_at":"tomorrow"}`, "expires_at", nil},
		{"override bad type", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"nuke","reason":"r","ttl":"5m"}`, "type", nil},
		{"override no target", "POST", "/admin/v1/overrides", `{"type":"ban","reason":"r","ttl":"5m"}`, "tenant", nil},
		{"override zero multiplier", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"multiplier","reason":"r","ttl":"5m"}`, "value", nil},
		{"override huge multiplier", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"multiplier","value":5000,"reason":"r","ttl":"5m"}`, "value", nil},
		{"override custom without limit", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"custom","reason":"r","ttl":"5m"}`, "limit", nil},
		{"override endpoint wildcard", "POST", "/admin/v1/overrides", `{"endpoint":"/api/*","type":"ban","reason":"r","ttl":"5m"}`, "endpoint", nil},
		{"override unknown rule", "POST", "/admin/v1/overrides", `{"tenant":"t","rule":"nope","type":"ban","reason":"r","ttl":"5m"}`, "rule", nil},
		{"override no reason", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","ttl":"5m"}`, "reason", nil},
		{"override unknown field", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"ban","reason":"r","ttl":"5m","source":"automatic"}`, "source", nil},
		{"override tenant too long", "POST", "/admin/v1/overrides", `{"tenant":"` + strings.Repeat("t", 513) + `","type":"ban","reason":"r","ttl":"5m"}`, "tenant", nil},
		{"override limit as string", "POST", "/admin/v1/overrides", `{"tenant":"t","type":"custom","limit":"5","reason":"r","ttl":"5m"}`, "limit", nil},
		{"exemption two callers", "POST", "/admin/v1/exemptions", `{"user":"u","tenant":"t","reason":"r"}`, "api_key", nil},
		{"exemption no caller", "POST", "/admin/v1/exemptions", `{"reason":"r"}`, "api_key", nil},
		{"exemption bad ip", "POST", "/admin/v1/exemptions", `{"ip":"10.0.0.0/99","reason":"r"}`, "ip", nil},
		{"exemption past expiry", "POST", "/admin/v1/exemptions", `{"user":"u","reason":"r","expires_at":"2001-01-01T00:00:00Z"}`, "expires_at", nil},
		{"exemption no reason", "POST", "/admin/v1/exemptions", `{"user":"u"}`, "reason", nil},
		{"exemption unknown field", "POST", "/admin/v1/exemptions", `{"user":"u","reason":"r","id":5}`, "id", nil},
		{"identity bad kind", "PUT", "/admin/v1/identities/robot/r2d2", `{"tier":"gold"}`, "kind", nil},
		{"identity trust above 1", "PUT", "/admin/v1/identities/user/u", `{"trust":2}`, "trust", nil},
		{"identity tenant for a user", "PUT", "/admin/v1/identities/user/u", `{"tenant":"t"}`, "tenant", nil},
		{"identity unknown field", "PUT", "/admin/v1/identities/user/u", `{"tier":"gold","level":3}`, "level", nil},
		{"identity other value", "PUT", "/admin/v1/identities/user/u", `{"value":"v","tier":"gold"}`, "value", nil},
		{"identity tier null type", "PUT", "/admin/v1/identities/user/u", `{"tier":7}`, "tier", nil},
		{"reset unknown field", "POST", "/admin/v1/reset", `{"user":"u","cost":1}`, "cost", nil},
		{"reset bad ip", "POST", "/admin/v1/reset", `{"ip":"not-an-ip"}`, "ip", nil},
		{"reset unknown rule", "POST", "/admin/v1/reset", `{"user":"u","rule":"nope"}`, "rule", nil},
		{"token bad role", "POST", "/admin/v1/tokens", `{"name":"n","role":"root"}`, "role", nil},
		{"token no name", "POST", "/admin/v1/tokens", `{"role":"read"}`, "name", nil},
		{"token unknown field", "POST", "/admin/v1/tokens", `{"name":"n","role":"read","token":"mine"}`, "token", nil},
		{"reason header too long", "DELETE", "/admin/v1/rules/r1", ``, "reason", map[string]string{"X-Sluice-Reason": strings.Repeat("r", 1025)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, n := e.version(), e.auditCount()
			ct := "application/json"
			if tc.method == "PATCH" {
				ct = "application/merge-patch+json"
			}
			c := call{method: tc.method, path: tc.path, role: control.RoleAdmin, body: tc.body, contentType: ct, header: tc.header}
			if tc.body == " " {
				c.body, c.contentType = "", "application/json"
			}
			r := e.do(c)
			if r.status != http.StatusBadRequest || r.str("field") != tc.field {
				t.Errorf("%d field %q, want 400 naming %q: %s", r.status, r.str("field"), tc.field, r.raw)
			}
			if e.version() != v || e.auditCount() != n {
				t.Errorf("bad input changed the store: version %d -> %d, audit events %d -> %d", v, e.version(), n, e.auditCount())
			}
		})
	}
	// Bodies not declared as JSON: 415 on every write.
	for _, tc := range []struct{ method, path, ct string }{
		{"POST", "/admin/v1/rules", "text/plain"},
		{"POST", "/admin/v1/rules", "application/merge-patch+json"},
		{"PUT", "/admin/v1/rules/r1", "application/x-www-form-urlencoded"},
		{"PATCH", "/admin/v1/rules/r1", "text/plain"},
		{"POST", "/admin/v1/overrides", ""},
		{"POST", "/admin/v1/exemptions", "application/json; charset=latin1"},
		{"PUT", "/admin/v1/identities/user/u", "text/json"},
		{"POST", "/admin/v1/reset", "multipart/form-data"},
		{"POST", "/admin/v1/tokens", "text/plain"},
	} {
		t.Run("415 "+tc.method+" "+tc.path+" "+tc.ct, func(t *testing.T) {
			v := e.version()
			req := call{method: tc.method, path: tc.path, role: control.RoleAdmin, body: `{"name":"x"}`, contentType: tc.ct}
			if tc.ct == "" {
				req.contentType = "-" // no Content-Type header at all
			}
			r := e.do(req)
			if r.status != http.StatusUnsupportedMediaType {
				t.Errorf("%d %s, want 415", r.status, r.raw)
			}
			if e.version() != v {
				t.Error("a refused body changed the store")
			}
		})
	}
}

func TestNotFoundConflictPrecondition(t *testing.T) {
	e := newEnv(t)
	created := e.mustCreate("POST", "/admin/v1/rules", ruleBody)
	tag := created.header.Get("ETag")
	w := control.RoleWrite
	for _, tc := range []struct {
		name   string
		c      call
		status int
	}{
		{"get missing rule", call{method: "GET", path: "/admin/v1/rules/nope", role: w}, 404},
		{"put missing rule", call{method: "PUT", path: "/admin/v1/rules/nope", role: w, body: `{"limit":1,"period":"1s"}`}, 404},
		{"patch missing rule", call{method: "PATCH", path: "/admin/v1/rules/nope", role: w, body: `{"limit":1}`}, 404},
		{"delete missing rule", call{method: "DELETE", path: "/admin/v1/rules/nope", role: w}, 404},
		{"missing override", call{method: "GET", path: "/admin/v1/overrides/999", role: w}, 404},
		{"override id not a number", call{method: "GET", path: "/admin/v1/overrides/abc", role: w}, 404},
		{"missing file override", call{method: "GET", path: "/admin/v1/overrides/-5", role: w}, 404},
		{"delete missing exemption", call{method: "DELETE", path: "/admin/v1/exemptions/999", role: w}, 404},
		{"missing identity", call{method: "GET", path: "/admin/v1/identities/user/nobody", role: w}, 404},
		{"identity of unknown kind", call{method: "GET", path: "/admin/v1/identities/robot/x", role: w}, 404},
		{"missing token", call{method: "DELETE", path: "/admin/v1/tokens/nobody", role: control.RoleAdmin}, 404},
		{"duplicate rule", call{method: "POST", path: "/admin/v1/rules", role: w, body: ruleBody}, 409},
		{"rule named like a file rule", call{method: "POST", path: "/admin/v1/rules", role: w, body: `{"name":"file-rule","limit":1,"period":"1s"}`}, 409},
		{"put file rule", call{method: "PUT", path: "/admin/v1/rules/file-rule", role: w, body: `{"limit":1,"period":"1s"}`}, 409},
		{"patch file rule", call{method: "PATCH", path: "/admin/v1/rules/file-rule", role: w, body: `{"limit":1}`}, 409},
		{"delete file rule", call{method: "DELETE", path: "/admin/v1/rules/file-rule", role: w}, 409},
		{"delete file override", call{method: "DELETE", path: "/admin/v1/overrides/-1", role: w}, 409},
		{"delete file exemption", call{method: "DELETE", path: "/admin/v1/exemptions/-1", role: w}, 409},
		{"duplicate token", call{method: "POST", path: "/admin/v1/tokens", role: control.RoleAdmin, body: `{"name":"reader","role":"read"}`}, 409},
		{"last admin token", call{method: "DELETE", path: "/admin/v1/tokens/root", role: control.RoleAdmin}, 409},
		{"stale If-Match", call{method: "PUT", path: "/admin/v1/rules/r1", role: w, body: `{"limit":1,"period":"1s"}`, header: map[string]string{"If-Match": `"999"`}}, 412},
		{"weak If-Match", call{method: "PUT", path: "/admin/v1/rules/r1", role: w, body: `{"limit":1,"period":"1s"}`, header: map[string]string{"If-Match": "W/" + tag}}, 412},
		{"If-Match on a missing rule", call{method: "PUT", path: "/admin/v1/rules/nope", role: w, body: `{"limit":1,"period":"1s"}`, header: map[string]string{"If-Match": "*"}}, 412},
		{"stale If-Match on patch", call{method: "PATCH", path: "/admin/v1/rules/r1", role: w, body: `{"limit":1}`, header: map[string]string{"If-Match": `"999"`}}, 412},
		{"stale If-Match on delete", call{method: "DELETE", path: "/admin/v1/rules/r1", role: w, header: map[string]string{"If-Match": `"999"`}}, 412},
		{"If-Match on create", call{method: "POST", path: "/admin/v1/overrides", role: w, body: `{"tenant":"t","type":"ban","ttl":"5m","reason":"r"}`, header: map[string]string{"If-Match": `"1"`}}, 412},
		{"current If-Match", call{method: "PUT", path: "/admin/v1/rules/r1", role: w, body: `{"limit":3,"period":"1s"}`, header: map[string]string{"If-Match": tag}}, 200},
		{"old If-Match after the change", call{method: "DELETE", path: "/admin/v1/rules/r1", role: w, header: map[string]string{"If-Match": tag}}, 412},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := e.version()
			r := e.do(tc.c)
			if r.status != tc.status {
				t.Fatalf("%d %s, want %d", r.status, r.raw, tc.status)
			}
			if tc.status >= 400 && e.version() != v {
				t.Errorf("a refused change changed the store")
			}
		})
	}
	// The file's resources are shown read-only with source "file".
	r := e.do(call{method: "GET", path: "/admin/v1/overrides/-1", role: control.RoleRead}).want(t, 200)
	if r.str("source") != "file" || r.str("tenant") != "file-tenant" || r.str("type") != "ban" {
		t.Errorf("file override: %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/rules/file-rule", role: control.RoleRead}).want(t, 200)
	if r.str("source") != "file" || r.json["limit"] != float64(100) || r.str("algorithm") != "gcra" {
		t.Errorf("file rule: %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/exemptions?source=file", role: control.RoleRead}).want(t, 200)
	if !strings.Contains(string(r.raw), `"ip":"10.0.0.0/8"`) || !strings.Contains(string(r.raw), `"source":"file"`) {
		t.Errorf("file exemptions: %s", r.raw)
	}
}

func TestOverrideExpiry(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	for _, tc := range []struct {
		name, body string
		want       time.Time
	}{
		{"ttl", `{"tenant":"a","type":"ban","ttl":"5m","reason":"r"}`, now.Add(5 * time.Minute)},
		{"ttl in days", `{"tenant":"b","type":"ban","ttl":"1d","reason":"r"}`, now.Add(24 * time.Hour)},
		{"expires_at", `{"tenant":"c","type":"ban","expires_at":"2027-01-02T03:04:05Z","reason":"r"}`, time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)},
		{"expires_at with an offset", `{"tenant":"d","type":"ban","expires_at":"2027-01-02T05:04:05+02:00","reason":"r"}`, time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(call{method: "POST", path: "/admin/v1/overrides", role: control.RoleWrite, body: tc.body}).want(t, 201)
			if got := r.str("expires_at"); got != tc.want.Format(time.RFC3339Nano) {
				t.Errorf("expires_at %s, want %s", got, tc.want.Format(time.RFC3339Nano))
			}
			if r.str("source") != "api" || r.str("created_by") != "writer" || r.str("created_at") != now.Format(time.RFC3339Nano) {
				t.Errorf("answer: %s", r.raw)
			}
			if r.header.Get("Location") == "" || r.str("policy_version") != r.header.Get(adminapi.PolicyVersionHeader) {
				t.Errorf("Location %q, policy_version %q, header %q", r.header.Get("Location"), r.str("policy_version"), r.header.Get(adminapi.PolicyVersionHeader))
			}
		})
	}
	// An expired override leaves the list of active ones.
	e.clock.Add(6 * time.Minute)
	r := e.do(call{method: "GET", path: "/admin/v1/overrides?tenant=a", role: control.RoleRead}).want(t, 200)
	if n := len(r.json["overrides"].([]any)); n != 0 {
		t.Errorf("expired override still listed: %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/overrides?source=api", role: control.RoleRead}).want(t, 200)
	if n := len(r.json["overrides"].([]any)); n != 3 {
		t.Errorf("%d api overrides, want 3: %s", n, r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/overrides?source=file", role: control.RoleRead}).want(t, 200)
	if n := len(r.json["overrides"].([]any)); n != 1 {
		t.Errorf("%d file overrides, want 1: %s", n, r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/overrides?tenant=a&tenant=b", role: control.RoleRead}).want(t, 400)
	e.do(call{method: "GET", path: "/admin/v1/overrides?tennant=a", role: control.RoleRead}).want(t, 400)
}

func TestMergePatch(t *testing.T) {
	e := newEnv(t)
	e.mustCreate("POST", "/admin/v1/rules", ruleBody)
	for _, tc := range []struct {
		name, ct, patch string
		check           func(t *testing.T, r *reply)
	}{
		{"replace a number", mergePatchType, `{"limit":20}`, func(t *testing.T, r *reply) {
			if r.json["limit"] != float64(20) || r.str("period") != "1m" {
				t.Errorf("%s", r.raw)
			}
		}},
		{"merge into an object and remove a member", "application/json", `{"match":{"method":"GET","endpoint":null}}`, func(t *testing.T, r *reply) {
			m := r.json["match"].(map[string]any)
			if m["method"] != "GET" || m["endpoint"] != nil {
				t.Errorf("match %v", m)
			}
		}},
		{"remove a tier", mergePatchType + "; charset=utf-8", `{"tiers":{"free":null,"gold":{"limit":50}}}`, func(t *testing.T, r *reply) {
			tiers := r.json["tiers"].(map[string]any)
			if _, ok := tiers["free"]; ok || tiers["gold"] == nil {
				t.Errorf("tiers %v", tiers)
			}
		}},
		{"remove an optional field", mergePatchType, `{"algorithm":null}`, func(t *testing.T, r *reply) {
			if _, ok := r.json["algorithm"]; ok {
				t.Errorf("%s", r.raw)
			}
		}},
		{"read-only members are ignored", mergePatchType, `{"source":"file","updated_by":"someone","shadow":true}`, func(t *testing.T, r *reply) {
			if r.str("source") != "api" || r.str("updated_by") != "writer" || r.json["shadow"] != true {
				t.Errorf("%s", r.raw)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(call{method: "PATCH", path: "/admin/v1/rules/r1", role: control.RoleWrite, body: tc.patch, contentType: tc.ct}).want(t, 200)
			tc.check(t, r)
			g := e.do(call{method: "GET", path: "/admin/v1/rules/r1", role: control.RoleRead}).want(t, 200)
			if g.header.Get("ETag") != r.header.Get("ETag") {
				t.Errorf("GET ETag %s after PATCH answered %s", g.header.Get("ETag"), r.header.Get("ETag"))
			}
		})
	}
	// A rule read with GET can be sent back with PUT as it is.
	g := e.do(call{method: "GET", path: "/admin/v1/rules/r1", role: control.RoleRead}).want(t, 200)
	e.do(call{method: "PUT", path: "/admin/v1/rules/r1", role: control.RoleWrite, body: string(g.raw), header: map[string]string{"If-Match": g.header.Get("ETag")}}).want(t, 200)
	// The audit log has the before and after of each change.
	evs, err := e.store.Audit(e.ctx, control.AuditFilter{Kind: control.KindRule, Action: control.ActionUpdate, Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].Actor != "writer" || evs[0].Before == nil || evs[0].After == nil {
		t.Errorf("audit %+v %v", evs, err)
	}
}

const mergePatchType = "application/merge-patch+json"

func TestUsageResetNodesAudit(t *testing.T) {
	e := newEnv(t)
	var d sluice.Decision
	for range 2 {
		if err := e.lim.Check(e.ctx, &sluice.Request{User: "alice"}, &d); err != nil {
			t.Fatal(err)
		}
	}
	r := e.do(call{method: "GET", path: "/admin/v1/usage?user=alice", role: control.RoleRead}).want(t, 200)
	res := r.json["results"].([]any)
	if len(res) != 1 || res[0].(map[string]any)["remaining"] != float64(1) || res[0].(map[string]any)["rule"] != "per-user" {
		t.Errorf("usage %s", r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/usage?ip=nope", role: control.RoleRead}).want(t, 400)
	r = e.do(call{method: "POST", path: "/admin/v1/reset", role: control.RoleWrite, body: `{"user":"alice"}`}).want(t, 200)
	if r.json["keys_reset"] != float64(1) {
		t.Errorf("reset %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/usage?user=alice", role: control.RoleRead}).want(t, 200)
	if r.json["remaining"] != float64(3) {
		t.Errorf("after reset %s", r.raw)
	}

	// Nodes: the live ones, with the version each enforces rendered as changes render it.
	if err := e.store.Heartbeat(e.ctx, control.Node{ID: "old", Addr: "10.1.1.2:8080", PolicyVersion: 2}); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(adminapi.DefaultNodeWindow + time.Second)
	if err := e.store.Heartbeat(e.ctx, control.Node{ID: "a", Addr: "10.1.1.1:8080", PolicyVersion: 7}); err != nil {
		t.Fatal(err)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/nodes", role: control.RoleRead}).want(t, 200)
	nodes := r.json["nodes"].([]any)
	if len(nodes) != 1 || nodes[0].(map[string]any)["id"] != "a" || nodes[0].(map[string]any)["policy_version"] != "pv-7" {
		t.Errorf("nodes %s", r.raw)
	}

	// Usage history and violations read the per-minute aggregates.
	m := e.clock.Now().Truncate(time.Minute)
	err := e.store.AddCounts(e.ctx,
		[]control.UsageCount{
			{Minute: m, Rule: "per-user", Tenant: "acme", Allowed: 5, Denied: 2, Soft: 1},
			{Minute: m, Rule: "per-tenant", Tenant: "acme", Allowed: 8},
			{Minute: m, Rule: control.DecisionRule, Tenant: "acme", Allowed: 5, Denied: 2, Soft: 1},
		},
		[]control.ViolationCount{{Minute: m, Rule: "per-user", Tenant: "acme", User: "alice", Denied: 2, Soft: 1, Limit: 3}})
	if err != nil {
		t.Fatal(err)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/usage/history?tenant=acme&step=1m&to=" + url.QueryEscape(e.in(time.Minute)), role: control.RoleRead}).want(t, 200)
	// Without rule=: the 8 requests, each once; not per-user's and per-tenant's 16 results.
	if pts := r.json["points"].([]any); len(pts) != 1 || pts[0].(map[string]any)["allowed"] != float64(5) || pts[0].(map[string]any)["denied"] != float64(2) {
		t.Errorf("history %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/usage/history?rule=per-tenant&step=1m&to=" + url.QueryEscape(e.in(time.Minute)), role: control.RoleRead}).want(t, 200)
	if pts := r.json["points"].([]any); len(pts) != 1 || pts[0].(map[string]any)["allowed"] != float64(8) {
		t.Errorf("history of per-tenant %s", r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/usage/history?step=5m", role: control.RoleRead}).want(t, 400)
	e.do(call{method: "GET", path: "/admin/v1/usage/history?from=2020-01-01T00:00:00Z", role: control.RoleRead}).want(t, 400)
	r = e.do(call{method: "GET", path: "/admin/v1/violations?tenant=acme", role: control.RoleRead}).want(t, 200)
	if vs := r.json["violations"].([]any); len(vs) != 2 || vs[0].(map[string]any)["state"] != "hard" || vs[0].(map[string]any)["count"] != float64(2) {
		t.Errorf("violations %s", r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/violations?limit=0", role: control.RoleRead}).want(t, 400)

	// Audit: newest first, filtered, the actor is the token's name.
	e.mustCreate("POST", "/admin/v1/rules", `{"name":"one","limit":1,"period":"1s"}`)
	e.do(call{method: "DELETE", path: "/admin/v1/rules/one", role: control.RoleAdmin, header: map[string]string{"X-Sluice-Reason": "cleanup"}}).want(t, 204)
	r = e.do(call{method: "GET", path: "/admin/v1/audit?kind=rule&target=one", role: control.RoleRead}).want(t, 200)
	evs := r.json["events"].([]any)
	if len(evs) != 2 {
		t.Fatalf("audit %s", r.raw)
	}
	first, second := evs[0].(map[string]any), evs[1].(map[string]any)
	if first["action"] != "delete" || first["actor"] != "root" || first["reason"] != "cleanup" || second["action"] != "create" || second["actor"] != "writer" {
		t.Errorf("audit %s", r.raw)
	}
	r = e.do(call{method: "GET", path: "/admin/v1/audit?actor=writer&limit=1", role: control.RoleRead}).want(t, 200)
	if evs := r.json["events"].([]any); len(evs) != 1 {
		t.Errorf("limit 1: %s", r.raw)
	}
	e.do(call{method: "GET", path: "/admin/v1/audit?kind=nonsense", role: control.RoleRead}).want(t, 400)
	e.do(call{method: "GET", path: "/admin/v1/audit?since=yesterday", role: control.RoleRead}).want(t, 400)
}

// What the API stores survives a restart of the node (SQLite).
func TestPersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	serve := func(c call) *reply {
		store := openStore(t, dir)
		defer store.Close()
		srv, err := adminapi.New(adminapi.Options{Control: store})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if _, err := store.GetToken(t.Context(), "root"); err != nil {
			if _, err := store.CreateToken(t.Context(), control.Change{Actor: "test"}, control.Token{Name: "root", Role: control.RoleAdmin, Hash: control.HashToken(secrets[control.RoleAdmin])}); err != nil {
				t.Fatal(err)
			}
		}
		e := &env{t: t, srv: srv, ctx: t.Context()}
		return e.doPlain(c)
	}
	serve(call{method: "POST", path: "/admin/v1/rules", role: control.RoleAdmin, body: ruleBody}).want(t, 201)
	serve(call{method: "PUT", path: "/admin/v1/identities/user/alice", role: control.RoleAdmin, body: `{"tier":"gold"}`}).want(t, 200)
	r := serve(call{method: "GET", path: "/admin/v1/rules/r1", role: control.RoleAdmin}).want(t, 200)
	if r.str("updated_by") != "root" || r.json["limit"] != float64(10) {
		t.Errorf("after restart: %s", r.raw)
	}
	serve(call{method: "GET", path: "/admin/v1/identities/user/alice", role: control.RoleAdmin}).want(t, 200)
	r = serve(call{method: "GET", path: "/admin/v1/audit?kind=rule", role: control.RoleAdmin}).want(t, 200)
	if n := len(r.json["events"].([]any)); n != 1 {
		t.Errorf("%d rule events after restart: %s", n, r.raw)
	}
}
