package adminapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// TestExportImportRoundTrip: what export writes, import reads back. Into the same store it
// changes nothing; into an empty one, a dry run lists every entry and writes nothing, and the
// applied import recreates every resource in one version, one audit event each, so that the
// second store exports the same document.
func TestExportImportRoundTrip(t *testing.T) {
	src := newEnv(t)
	for _, c := range []call{
		{method: "POST", path: "/admin/v1/rules", body: `{"name":"r1","key":["user"],"algorithm":"fixed_window","limit":5,"period":"1m"}`},
		{method: "POST", path: "/admin/v1/overrides", body: `{"tenant":"acme","type":"multiplier","value":2,"ttl":"1h","reason":"contract"}`},
		{method: "POST", path: "/admin/v1/overrides", body: `{"user":"bob","rule":"r1","type":"ban","ttl":"1h","reason":"abuse"}`},
		{method: "POST", path: "/admin/v1/exemptions", body: `{"ip":"10.0.0.0/8","reason":"internal"}`},
		{method: "PUT", path: "/admin/v1/identities/api_key/k1", body: `{"tier":"gold","tenant":"acme"}`},
		{method: "PUT", path: "/admin/v1/identities/user/bob", body: `{"tier":"free","trust":0.5}`},
		{method: "PUT", path: "/admin/v1/domains/edge", body: `{"domain":"edge","descriptors":[{"key":"k","rate_limit":{"unit":"minute","requests_per_unit":7}}]}`},
	} {
		c.role = control.RoleWrite
		if r := src.do(c); r.status >= 300 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, r.status, r.raw)
		}
	}
	exported := src.do(call{method: "GET", path: "/admin/v1/export", role: control.RoleRead})
	if exported.status != 200 {
		t.Fatalf("export: %d %s", exported.status, exported.raw)
	}
	for list, n := range map[string]int{"rules": 1, "overrides": 2, "exemptions": 1, "identities": 2, "domains": 1} {
		if got, _ := exported.json[list].([]any); len(got) != n {
			t.Errorf("export has %d %s, want %d", len(got), list, n)
		}
	}
	doc := string(exported.raw)

	again := src.do(call{method: "POST", path: "/admin/v1/import?apply=true", role: control.RoleWrite, body: doc})
	if again.status != 200 || again.json["unchanged"] != float64(7) || again.json["created"] != float64(0) {
		t.Errorf("import into the store it came from: %d %s; want 7 unchanged", again.status, again.raw)
	}

	dst := newEnv(t)
	v, events := dst.version(), dst.auditCount()
	dry := dst.do(call{method: "POST", path: "/admin/v1/import", role: control.RoleWrite, body: doc})
	if dry.status != 200 || dry.json["applied"] != false || dry.json["created"] != float64(7) {
		t.Errorf("dry run: %d %s; want 7 to create", dry.status, dry.raw)
	}
	if changes, _ := dry.json["changes"].([]any); len(changes) != 7 {
		t.Errorf("dry run lists %d changes, want 7", len(changes))
	}
	if dst.version() != v || dst.auditCount() != events {
		t.Error("a dry run wrote")
	}
	applied := dst.do(call{method: "POST", path: "/admin/v1/import?apply=true", role: control.RoleWrite, body: doc})
	if applied.status != 200 || applied.json["created"] != float64(7) || dst.version() != v+1 || dst.auditCount() != events+7 {
		t.Errorf("import: %d %s, version %d (was %d), %d audit events (was %d); want 7 created in one version, 7 events",
			applied.status, applied.raw, dst.version(), v, dst.auditCount(), events)
	}
	if re := dst.do(call{method: "GET", path: "/admin/v1/export", role: control.RoleRead}); string(re.raw) != doc {
		t.Errorf("the second store exports\n%s\nthe first\n%s", re.raw, doc)
	}
}

// TestImportRejectsBadEntries: a bad entry answers 400 naming its list, index and field;
// nothing of the document is written, and no audit event.
func TestImportRejectsBadEntries(t *testing.T) {
	e := newEnv(t)
	good := `{"tenant":"t%d","type":"ban","ttl":"1h","reason":"r"}`
	for _, c := range []struct {
		name, bad, field string
	}{
		{"unknown type", `{"tenant":"x","type":"nope","ttl":"1h","reason":"r"}`, "overrides[2].type"},
		{"no expiry", `{"tenant":"x","type":"ban","reason":"r"}`, "overrides[2].expires_at"},
		{"unknown rule", `{"tenant":"x","rule":"missing","type":"ban","ttl":"1h","reason":"r"}`, "overrides[2].rule"},
		{"unknown field", `{"tenant":"x","type":"ban","ttl":"1h","reason":"r","colour":"red"}`, "overrides[2].colour"},
		{"duplicate target", fmt.Sprintf(good, 0), "overrides[2]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, events := e.version(), e.auditCount()
			body := fmt.Sprintf(`{"identities":[{"kind":"user","value":"u","tier":"gold"}],"overrides":[%s,%s,%s]}`,
				fmt.Sprintf(good, 0), fmt.Sprintf(good, 1), c.bad)
			r := e.do(call{method: "POST", path: "/admin/v1/import?apply=true", role: control.RoleWrite, body: body})
			if r.status != 400 || r.str("field") != c.field {
				t.Errorf("%d %s; want 400 naming %s", r.status, r.raw, c.field)
			}
			if e.version() != v || e.auditCount() != events {
				t.Error("a rejected import wrote")
			}
		})
	}
	if r := e.do(call{method: "POST", path: "/admin/v1/import", role: control.RoleRead, body: `{}`}); r.status != 403 {
		t.Errorf("import with a read token: %d, want 403", r.status)
	}
	if r := e.do(call{method: "POST", path: "/admin/v1/import?apply=maybe", role: control.RoleWrite, body: `{}`}); r.status != 400 || !strings.Contains(r.str("field"), "apply") {
		t.Errorf("apply=maybe: %d %s, want 400 naming apply", r.status, r.raw)
	}
}
