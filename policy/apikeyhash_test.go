package policy

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/key"
)

// TestOverrideAPIKeyHashTarget: an api_key_hash override matches the requests whose key hashes
// to it, native and Envoy, as an api_key override of the key would; other keys are untouched.
func TestOverrideAPIKeyHashTarget(t *testing.T) {
	t.Parallel()
	h := key.HashedAPIKey("sk-live-1")
	s := mustCompile(t, `
rules:
  - {name: r, key: [api_key], algorithm: fixed_window, limit: 1000, period: 1m}
overrides:
  - {api_key_hash: "`+strings.ToUpper(h)+`", type: custom, limit: 5, expires_at: "2027-01-01T00:00:00Z"}
  - {api_key_hash: "`+key.HashedAPIKey("sk-banned")+`", type: ban, reason: abuse, expires_at: "2027-01-01T00:00:00Z"}
  - {api_key_hash: "`+h+`", tenant: acme, type: custom, limit: 3, expires_at: "2027-01-01T00:00:00Z"}
`)
	var sc Scratch
	cases := []struct {
		name  string
		req   Request
		limit int64
		envoy bool // MatchEnvoyOverrides finds an override
	}{
		{"the key of the hash (given in upper case)", Request{APIKey: "sk-live-1"}, 5, true},
		{"the key with the tenant of the two-attribute target", Request{APIKey: "sk-live-1", Tenant: "acme"}, 3, true},
		{"another key", Request{APIKey: "sk-live-2"}, 1000, false},
		{"the hash itself sent as a key", Request{APIKey: h}, 1000, false},
		{"no key", Request{Tenant: "acme"}, 1000, false},
	}
	for _, c := range cases {
		if got := s.Resolve(&c.req, now, &sc)[0].Spec.Limit; got != c.limit {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.limit)
		}
		if got := s.MatchEnvoyOverrides(&c.req, &sc); got != c.envoy {
			t.Errorf("%s: MatchEnvoyOverrides = %v, want %v", c.name, got, c.envoy)
		}
	}
	if _, reason, ok := s.BanFor(&Request{APIKey: "sk-banned"}, now); !ok || reason != "abuse" {
		t.Errorf("BanFor(banned key) = %q, %v", reason, ok)
	}
	if _, _, ok := s.BanFor(&Request{APIKey: "sk-live-1"}, now); ok {
		t.Error("a key without a ban banned")
	}
}

// TestOverrideAPIKeyHashInvalid: a malformed hash, or one with api_key or ip, is an error
// naming the field.
func TestOverrideAPIKeyHashInvalid(t *testing.T) {
	t.Parallel()
	h := key.HashedAPIKey("k")
	for _, c := range []struct{ o, field string }{
		{`{api_key_hash: "sk-live-1", type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "api_key_hash"},
		{`{api_key_hash: "` + h[1:] + `", type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "api_key_hash"},
		{`{api_key_hash: "` + h + `0", type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "api_key_hash"},
		{`{api_key_hash: "#` + strings.Repeat("g", 32) + `", type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "api_key_hash"},
		{`{api_key_hash: "` + h + `", api_key: k, type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "api_key_hash"},
		{`{api_key_hash: "` + h + `", ip: 10.0.0.1, type: ban, expires_at: "2027-01-01T00:00:00Z"}`, "ip"},
	} {
		_, err := LoadFiles(map[string][]byte{"p.yaml": []byte("rules: []\noverrides:\n  - " + c.o + "\n")})
		if err == nil || !strings.Contains(err.Error(), "overrides[0]."+c.field+":") {
			t.Errorf("%s: error %v, want one naming overrides[0].%s", c.o, err, c.field)
		}
	}
}
