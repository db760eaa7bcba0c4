package policy

import (
	"strings"
	"testing"
)

// TestOverrideIPTarget: an ip override matches the request's address by CIDR or exact
// address, longest prefix first; requests without an address or elsewhere are untouched.
func TestOverrideIPTarget(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: r, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}
overrides:
  - {ip: 10.0.0.0/8, type: custom, limit: 5, expires_at: "2027-01-01T00:00:00Z"}
  - {ip: 10.1.2.3, type: custom, limit: 3, expires_at: "2027-01-01T00:00:00Z"}
  - {ip: "2001:db8::/32", type: custom, limit: 7, expires_at: "2027-01-01T00:00:00Z"}
`)
	var sc Scratch
	cases := []struct {
		name  string
		req   Request
		limit int64
	}{
		{"in the CIDR", Request{Tenant: "acme", IP: "10.9.9.9"}, 5},
		{"the exact address beats its CIDR", Request{Tenant: "acme", IP: "10.1.2.3"}, 3},
		{"v4-mapped v6 address", Request{Tenant: "acme", IP: "::ffff:10.1.2.3"}, 3},
		{"v6 CIDR", Request{Tenant: "acme", IP: "2001:db8::1"}, 7},
		{"outside every target", Request{Tenant: "acme", IP: "192.0.2.1"}, 1000},
		{"no address", Request{Tenant: "acme"}, 1000},
		{"an address that does not parse", Request{Tenant: "acme", IP: "10.1.2.3:80"}, 1000},
	}
	for _, c := range cases {
		if got := s.Resolve(&c.req, now, &sc)[0].Spec.Limit; got != c.limit {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.limit)
		}
	}
	banned := mustCompile(t, "rules: []\noverrides:\n  - {ip: 192.0.2.0/24, type: ban, expires_at: \"2027-01-01T00:00:00Z\", reason: abuse}\n")
	if _, reason, ok := banned.BanFor(&Request{IP: "192.0.2.77"}, now); !ok || reason != "abuse" {
		t.Errorf("BanFor(ip) = %q, %v", reason, ok)
	}
	if _, _, ok := banned.BanFor(&Request{IP: "192.0.3.1"}, now); ok {
		t.Error("an address outside the CIDR banned")
	}
}

// TestOverrideIPInvalid: a bad ip, or an ip with another target, is an error naming "ip".
func TestOverrideIPInvalid(t *testing.T) {
	t.Parallel()
	for _, o := range []string{
		`{ip: "10.0.0.300", type: ban, expires_at: "2027-01-01T00:00:00Z"}`,
		`{ip: "10.0.0.0/40", type: ban, expires_at: "2027-01-01T00:00:00Z"}`,
		`{ip: "10.0.0.1", tenant: acme, type: ban, expires_at: "2027-01-01T00:00:00Z"}`,
	} {
		_, err := LoadFiles(map[string][]byte{"p.yaml": []byte("rules: []\noverrides:\n  - " + o + "\n")})
		if err == nil || !strings.Contains(err.Error(), "overrides[0].ip:") {
			t.Errorf("%s: error %v, want one naming overrides[0].ip", o, err)
		}
	}
}

// TestEnvoyOverrideIP: MatchEnvoyOverrides finds an ip target for an Envoy request by its
// address, and none for another address or none at all.
func TestEnvoyOverrideIP(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, "rules: []\noverrides:\n  - {ip: 10.0.0.0/8, type: ban, expires_at: \"2027-01-01T00:00:00Z\"}\n")
	var sc Scratch
	for _, c := range []struct {
		ip   string
		want bool
	}{{"10.2.3.4", true}, {"11.0.0.1", false}, {"", false}} {
		if got := s.MatchEnvoyOverrides(&Request{IP: c.ip}, &sc); got != c.want {
			t.Errorf("MatchEnvoyOverrides(ip %q) = %v, want %v", c.ip, got, c.want)
		}
	}
}
