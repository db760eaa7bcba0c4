package envoyconf

import (
	"strings"
	"testing"
)

// TestStatKey: a limit's ID becomes the reference's key: key_value levels joined by dots,
// escapes undone.
func TestStatKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ domain, id, want string }{
		{"edge", "client_id", "edge.client_id"},
		{"edge", "message_type=marketing/to_number", "edge.message_type_marketing.to_number"},
		{"edge", "path=%2Fapi%2Fv1", "edge.path_/api/v1"},
		{"edge", "k=a%3Db", "edge.k_a=b"},
		{"edge", "client_id=batch-*", "edge.client_id_batch-*"},
	}
	for _, tc := range tests {
		if got := StatKey(tc.domain, tc.id); got != tc.want {
			t.Errorf("StatKey(%q, %q) = %q, want %q", tc.domain, tc.id, got, tc.want)
		}
	}
}

// TestParseAttributeMap: the flag's form, and every mistake named.
func TestParseAttributeMap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want, err string
	}{
		{in: "", want: ""},
		{in: "user=x-user-id, tenant=org", want: "tenant=org,user=x-user-id"},
		{in: "tier=plan,tier=plan", want: "tier=plan"},
		{in: "tier=plan,tier=level", err: "tier is mapped twice"},
		{in: "org=tenant", err: `"org" is not an attribute`},
		{in: "user", err: "want attribute=entry-key"},
		{in: "user=", err: "want attribute=entry-key"},
	}
	for _, tc := range tests {
		m, err := ParseAttributeMap(tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseAttributeMap(%q) = %v, %v; want an error with %q", tc.in, m, err, tc.err)
			}
		case err != nil:
			t.Errorf("ParseAttributeMap(%q): %v", tc.in, err)
		case m.String() != tc.want:
			t.Errorf("ParseAttributeMap(%q) = %q, want %q", tc.in, m.String(), tc.want)
		}
	}
}

// TestDomainAttributes: a domain file's attributes: mapping is read, merged across files,
// and checked with the field named.
func TestDomainAttributes(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{
		"a.yaml": "domain: d\nattributes: {user: x-user-id}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: kay}\n",
		"b.yaml": "domain: d\nattributes: {tenant: org}\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"c.yaml": "domain: plain\ndescriptors:\n  - key: k\n",
	}, true)
	if got := c.Attributes("d").String(); got != "tenant=org,user=x-user-id" {
		t.Errorf("attributes of d = %q", got)
	}
	if got := c.Attributes("plain"); got != nil {
		t.Errorf("attributes of plain = %v, want none", got)
	}
	for _, name := range []string{"kay", "d.k", "k", "d.j"} {
		if !c.NamesLimit(name) {
			t.Errorf("NamesLimit(%q) = false", name)
		}
	}
	if c.NamesLimit("d.x") || c.NamesLimit("") {
		t.Error("NamesLimit names a limit that does not exist")
	}
	for _, tc := range []struct{ file, field, msg string }{
		{"domain: d\nattributes: {org: tenant}\n", "attributes.org", "unknown field"},
		{"domain: d\nattributes: [user]\n", "attributes", "must be a mapping"},
		{"domain: d\nattributes: {user: ''}\n", "attributes.user", "must name an entry key"},
	} {
		le, msg := loadErr(t, map[string]string{"f.yaml": tc.file}, false)
		if le.Field != tc.field || !strings.Contains(msg, tc.msg) {
			t.Errorf("%q: error %q (field %q), want field %q with %q", tc.file, msg, le.Field, tc.field, tc.msg)
		}
	}
	_, msg := loadErr(t, map[string]string{
		"a.yaml": "domain: d\nattributes: {user: x-user-id}\n",
		"b.yaml": "domain: d\nattributes: {user: uid}\n",
	}, true)
	if !strings.Contains(msg, "user is mapped twice") {
		t.Errorf("conflicting merge: %q", msg)
	}
}
