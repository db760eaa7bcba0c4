package adminapi_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// TestIdentityOverrideTargets: overrides by API key hash and by IP are created, read back,
// listed and exported; bad ones are a 400 naming the field and change nothing; a PATCH may
// not move one to another target.
func TestIdentityOverrideTargets(t *testing.T) {
	e := newEnv(t)
	hash := "#" + strings.Repeat("0f", 16)
	byHash := e.mustCreate("POST", "/admin/v1/overrides", `{"api_key_hash":"`+hash+`","type":"multiplier","value":0.1,"ttl":"5m","reason":"abuse"}`)
	byIP := e.mustCreate("POST", "/admin/v1/overrides", `{"ip":"192.0.2.0/24","type":"ban","ttl":"5m","reason":"abuse"}`)
	if byHash.str("api_key_hash") != hash || byHash.str("api_key") != "" || byIP.str("ip") != "192.0.2.0/24" {
		t.Errorf("created %s and %s", byHash.raw, byIP.raw)
	}
	list := e.do(call{method: "GET", path: "/admin/v1/overrides", role: control.RoleRead}).want(t, http.StatusOK)
	if !strings.Contains(string(list.raw), `"api_key_hash":"`+hash+`"`) || !strings.Contains(string(list.raw), `"ip":"192.0.2.0/24"`) {
		t.Errorf("list does not show the targets: %s", list.raw)
	}
	exported := e.do(call{method: "GET", path: "/admin/v1/export", role: control.RoleRead}).want(t, http.StatusOK)
	if !strings.Contains(string(exported.raw), `"api_key_hash":"`+hash+`"`) || !strings.Contains(string(exported.raw), `"ip":"192.0.2.0/24"`) {
		t.Errorf("export does not hold the targets: %s", exported.raw)
	}
	again := e.do(call{method: "POST", path: "/admin/v1/import?apply=true", role: control.RoleWrite, body: string(exported.raw)})
	if again.status != http.StatusOK || again.json["unchanged"] != float64(2) {
		t.Errorf("import of the export: %d %s; want 2 unchanged", again.status, again.raw)
	}

	id := func(r *reply) string { id, _ := r.json["id"].(float64); return strconv.FormatInt(int64(id), 10) }
	cases := []badInput{
		{"hash not a hash", "POST", "/admin/v1/overrides", `{"api_key_hash":"sk-live-1","type":"ban","ttl":"5m","reason":"r"}`, "api_key_hash", nil},
		{"hash in upper case", "POST", "/admin/v1/overrides", `{"api_key_hash":"` + strings.ToUpper(hash) + `","type":"ban","ttl":"5m","reason":"r"}`, "api_key_hash", nil},
		{"hash and key", "POST", "/admin/v1/overrides", `{"api_key_hash":"` + hash + `","api_key":"k","type":"ban","ttl":"5m","reason":"r"}`, "api_key_hash", nil},
		{"hash as a number", "POST", "/admin/v1/overrides", `{"api_key_hash":5,"type":"ban","ttl":"5m","reason":"r"}`, "api_key_hash", nil},
		{"ip not an address", "POST", "/admin/v1/overrides", `{"ip":"not-an-ip","type":"ban","ttl":"5m","reason":"r"}`, "ip", nil},
		{"ip bad CIDR", "POST", "/admin/v1/overrides", `{"ip":"10.0.0.0/99","type":"ban","ttl":"5m","reason":"r"}`, "ip", nil},
		{"ip host bits", "POST", "/admin/v1/overrides", `{"ip":"10.0.0.1/8","type":"ban","ttl":"5m","reason":"r"}`, "ip", nil},
		{"ip with a tenant", "POST", "/admin/v1/overrides", `{"ip":"10.0.0.1","tenant":"acme","type":"ban","ttl":"5m","reason":"r"}`, "ip", nil},
		{"ip with a hash", "POST", "/admin/v1/overrides", `{"ip":"10.0.0.1","api_key_hash":"` + hash + `","type":"ban","ttl":"5m","reason":"r"}`, "ip", nil},
		{"patch moves the ip", "PATCH", "/admin/v1/overrides/" + id(byIP), `{"ip":"192.0.3.0/24"}`, "ip", nil},
		{"patch moves the hash", "PATCH", "/admin/v1/overrides/" + id(byHash), `{"api_key_hash":"#` + strings.Repeat("1", 32) + `"}`, "api_key_hash", nil},
		{"patch adds an ip", "PATCH", "/admin/v1/overrides/" + id(byHash), `{"ip":"10.0.0.1"}`, "ip", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, n := e.version(), e.auditCount()
			ct := "application/json"
			if tc.method == "PATCH" {
				ct = "application/merge-patch+json"
			}
			r := e.do(call{method: tc.method, path: tc.path, role: control.RoleAdmin, body: tc.body, contentType: ct})
			if r.status != http.StatusBadRequest || r.str("field") != tc.field {
				t.Errorf("%d field %q, want 400 naming %q: %s", r.status, r.str("field"), tc.field, r.raw)
			}
			if e.version() != v || e.auditCount() != n {
				t.Errorf("bad input changed the store: version %d -> %d, audit events %d -> %d", v, e.version(), n, e.auditCount())
			}
		})
	}
}
