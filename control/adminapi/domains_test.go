package adminapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// TestDomains: an Envoy domain is put as JSON or YAML, read back as JSON with where it comes
// from, listed after the files' domains, replaced with If-Match, and deleted; each change is
// audited with the token's name.
func TestDomains(t *testing.T) {
	e := newEnv(t)
	// JSON without "domain": the path names it.
	r := e.do(call{method: "PUT", path: "/admin/v1/domains/edge", role: control.RoleWrite,
		body: `{"descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`})
	if r.status != http.StatusOK || r.str("domain") != "edge" || r.str("source") != "api" || r.str("updated_by") != "writer" ||
		r.str("policy_version") == "" || r.header.Get("ETag") == "" {
		t.Fatalf("PUT = %d %s", r.status, r.raw)
	}
	ev, err := e.store.Audit(e.ctx, control.AuditFilter{Kind: control.KindDomain, Limit: 1})
	if err != nil || len(ev) != 1 || ev[0].Actor != "writer" || ev[0].Action != control.ActionCreate || ev[0].Target != "edge" ||
		!strings.HasPrefix(string(ev[0].After), `{"domain":"edge","descriptors":`) {
		t.Fatalf("audit = %+v, %v", ev, err)
	}

	// What GET answers can be sent back as it is.
	got := e.do(call{method: "GET", path: "/admin/v1/domains/edge", role: control.RoleRead})
	if got.status != http.StatusOK || got.header.Get("ETag") != r.header.Get("ETag") {
		t.Fatalf("GET = %d %s", got.status, got.raw)
	}
	back := e.do(call{method: "PUT", path: "/admin/v1/domains/edge", role: control.RoleWrite, body: string(got.raw),
		header: map[string]string{"If-Match": got.header.Get("ETag")}})
	if back.status != http.StatusOK {
		t.Fatalf("PUT of the GET answer = %d %s", back.status, back.raw)
	}
	stale := e.do(call{method: "PUT", path: "/admin/v1/domains/edge", role: control.RoleWrite, body: string(got.raw),
		header: map[string]string{"If-Match": got.header.Get("ETag")}})
	if stale.status != http.StatusPreconditionFailed {
		t.Errorf("PUT with a stale If-Match = %d %s", stale.status, stale.raw)
	}

	// YAML, as a file of --config is written; answered and stored as JSON.
	y := e.do(call{method: "PUT", path: "/admin/v1/domains/api", role: control.RoleWrite, contentType: "application/yaml",
		body: "domain: api\ndescriptors:\n  - key: tenant\n    value: acme*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 7, name: acme}\n"})
	if y.status != http.StatusOK {
		t.Fatalf("PUT YAML = %d %s", y.status, y.raw)
	}
	d, err := e.store.GetDomain(e.ctx, "api")
	if want := `{"domain":"api","descriptors":[{"key":"tenant","value":"acme*","share_threshold":true,"rate_limit":{"unit":"minute","requests_per_unit":7,"name":"acme"}}]}`; err != nil || string(d.Body) != want {
		t.Errorf("stored %s, %v; want %s", d.Body, err, want)
	}

	list := e.do(call{method: "GET", path: "/admin/v1/domains", role: control.RoleRead})
	var l struct {
		Domains []struct{ Domain, Source string } `json:"domains"`
	}
	if err := json.Unmarshal(list.raw, &l); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range l.Domains {
		names = append(names, x.Domain+":"+x.Source)
	}
	if strings.Join(names, ",") != "file-edge:file,api:api,edge:api" {
		t.Errorf("list = %v, want the file's domain, then the API's by name", names)
	}
	// An override's rule may name an API domain's limit, by its name or stat key.
	for _, tc := range []struct {
		rule string
		want int
	}{{"acme", http.StatusCreated}, {"api.tenant_acme*", http.StatusCreated}, {"api.nope", http.StatusBadRequest}} {
		r := e.do(call{method: "POST", path: "/admin/v1/overrides", role: control.RoleWrite,
			body: `{"tenant":"acme","rule":"` + tc.rule + `","type":"multiplier","value":2,"ttl":"1h","reason":"t"}`})
		if r.status != tc.want {
			t.Errorf("override naming %q = %d %s, want %d", tc.rule, r.status, r.raw, tc.want)
		}
	}

	file := e.do(call{method: "GET", path: "/admin/v1/domains/file-edge", role: control.RoleRead})
	if file.status != http.StatusOK || file.str("source") != "file" || file.json["descriptors"] == nil {
		t.Errorf("GET of a file domain = %d %s", file.status, file.raw)
	}

	if r := e.do(call{method: "DELETE", path: "/admin/v1/domains/api", role: control.RoleWrite}); r.status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.status, r.raw)
	}
	if r := e.do(call{method: "GET", path: "/admin/v1/domains/api", role: control.RoleRead}); r.status != http.StatusNotFound || r.str("error") != "no domain with that name" {
		t.Errorf("GET after DELETE = %d %s", r.status, r.raw)
	}
	ev, _ = e.store.Audit(e.ctx, control.AuditFilter{Kind: control.KindDomain})
	if len(ev) != 4 || ev[0].Action != control.ActionDelete || ev[0].Target != "api" {
		t.Errorf("audit = %+v; want 4 events, the delete last", ev)
	}
}

// TestDomainRefusals: a bad domain is refused naming the field, as a file is, and nothing
// changes (no version, no audit event); a domain of the files is read-only.
func TestDomainRefusals(t *testing.T) {
	e := newEnv(t)
	e.mustCreate("PUT", "/admin/v1/domains/edge", domainBody)
	for _, tc := range []struct {
		name, method, path, body, contentType string
		status                                int
		field, msg                            string
	}{
		{name: "a bad unit", body: `{"domain":"edge","descriptors":[{"key":"k","rate_limit":{"unit":"fortnight","requests_per_unit":1}}]}`,
			status: 400, field: "descriptors[0].rate_limit.unit", msg: `invalid unit "fortnight"`},
		{name: "every error is listed", body: `{"descriptors":[{"key":""},{"key":"k","rate_limit":{"unit":"second","requests_per_unit":-1}}]}`,
			status: 400, field: "descriptors[0].key", msg: "descriptors[1].rate_limit.requests_per_unit: must not be negative"},
		{name: "a misspelled field", body: `{"domain":"edge","descriptor":[]}`, status: 400, field: "descriptor", msg: `did you mean "descriptors"?`},
		{name: "another domain than the path's", body: `{"domain":"other"}`, status: 400, field: "domain", msg: "differs from the domain in the path"},
		{name: "YAML with its line", contentType: "application/yaml", body: "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: weekly}\n",
			status: 400, field: "descriptors[0].rate_limit.unit", msg: "(line 4)"},
		{name: "YAML that JSON cannot say", contentType: "application/yaml", body: "domain: edge\ndescriptors:\n  - {key: k, shadow_mode: yes}\n",
			status: 400, field: "document", msg: "write booleans as true or false"},
		{name: "not YAML", contentType: "application/yaml", body: "domain: [", status: 400, field: "yaml"},
		{name: "duplicate JSON members", body: `{"domain":"edge","domain":"edge"}`, status: 400},
		{name: "not a JSON object", body: `["edge"]`, status: 400, field: "body"},
		{name: "an empty body", body: " ", status: 400, field: "body"},
		{name: "another media type", body: "domain: edge", contentType: "text/plain", status: 415, field: "Content-Type"},
		{name: "a name too long", path: "/admin/v1/domains/" + strings.Repeat("d", 129), body: `{}`, status: 400, field: "domain"},
		{name: "put a file's domain", path: "/admin/v1/domains/file-edge", body: `{"domain":"file-edge"}`, status: 409, msg: "policy file"},
		{name: "delete a file's domain", method: "DELETE", path: "/admin/v1/domains/file-edge", status: 409, msg: "policy file"},
		{name: "delete a missing domain", method: "DELETE", path: "/admin/v1/domains/nope", status: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, path := tc.method, tc.path
			if method == "" {
				method = "PUT"
			}
			if path == "" {
				path = "/admin/v1/domains/edge"
			}
			v, _ := e.store.Version(e.ctx)
			events, _ := e.store.Audit(e.ctx, control.AuditFilter{})
			r := e.do(call{method: method, path: path, role: control.RoleWrite, body: tc.body, contentType: tc.contentType})
			if r.status != tc.status || (tc.field != "" && r.str("field") != tc.field) || !strings.Contains(r.str("error"), tc.msg) {
				t.Errorf("%s %s = %d %s; want %d, field %q, an error saying %q", method, path, r.status, r.raw, tc.status, tc.field, tc.msg)
			}
			v2, _ := e.store.Version(e.ctx)
			events2, _ := e.store.Audit(e.ctx, control.AuditFilter{})
			if v2 != v || len(events2) != len(events) {
				t.Errorf("the refusal changed the store: version %d -> %d, %d -> %d audit events", v, v2, len(events), len(events2))
			}
		})
	}
	d, err := e.store.GetDomain(e.ctx, "edge")
	if err != nil || string(d.Body) != domainBody {
		t.Errorf("edge after the refusals: %s, %v", d.Body, err)
	}
}
