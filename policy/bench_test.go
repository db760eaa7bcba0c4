package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkResolve is the policy's share of a Check: validation, exemptions, rule lookup and
// key building for one request that one rule matches.
func BenchmarkResolve(b *testing.B) {
	snap := mustCompile(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 100, period: 1s}
`)
	r := Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}
	var sc Scratch
	b.Run("validate", func(b *testing.B) {
		for b.Loop() {
			if err := r.Validate(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("resolve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if snap.Exempt(&r) || len(snap.Resolve(&r, time.Time{}, &sc)) != 1 {
				b.Fatal("want one limit")
			}
		}
	})
}

// BenchmarkResolveAPIKey is the dearer case of callers identified by API key: every rule keyed
// or tagged by it needs the key's SHA-256, which Resolve makes once per request.
func BenchmarkResolveAPIKey(b *testing.B) {
	snap := mustCompile(b, `
rules:
  - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 100, period: 1s}
  - {name: per-key-endpoint, key: [api_key, endpoint], algorithm: token_bucket, limit: 100, period: 1s}
`)
	r := Request{Tenant: "acme", APIKey: "sk_live_51HxYzAbCdEfGhIjKlMnOpQr", Endpoint: "/api/items", Method: "GET"}
	var sc Scratch
	b.ReportAllocs()
	for b.Loop() {
		if len(snap.Resolve(&r, time.Time{}, &sc)) != 2 {
			b.Fatal("want two limits")
		}
	}
}

// BenchmarkResolveOverrides resolves a request against a policy with overrides of several
// target shapes, one of which applies: the override lookup is on every request of such a policy.
func BenchmarkResolveOverrides(b *testing.B) {
	snap := mustCompile(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 100, period: 1s}
  - {name: per-tenant, key: [tenant], algorithm: token_bucket, limit: 1000, period: 1s}
overrides:
  - {tenant: acme, type: multiplier, value: 2, expires_at: "2099-01-01T00:00:00Z"}
  - {tenant: acme, user: u1, type: custom, limit: 5, expires_at: "2099-01-01T00:00:00Z"}
  - {tenant: beta, endpoint: /api/items, type: ban, expires_at: "2099-01-01T00:00:00Z"}
`)
	r := Request{Tenant: "acme", User: "u1", Endpoint: "/api/items", Method: "GET"}
	var sc Scratch
	b.ReportAllocs()
	for b.Loop() {
		if ls := snap.Resolve(&r, now, &sc); len(ls) != 2 || ls[0].Spec.Limit != 5 {
			b.Fatal("want two limits, the first overridden")
		}
	}
}

// BenchmarkResolveOverridesAPIKey: an override on an API key, for a caller whose key also
// forms its bucket key; the key's hash is made once for both.
func BenchmarkResolveOverridesAPIKey(b *testing.B) {
	snap := mustCompile(b, `
rules:
  - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 100, period: 1s}
overrides:
  - {api_key: sk_live_51HxYzAbCdEfGhIjKlMnOpQr, type: custom, limit: 5, expires_at: "2099-01-01T00:00:00Z"}
  - {tenant: acme, user: u1, type: custom, limit: 7, expires_at: "2099-01-01T00:00:00Z"}
`)
	r := Request{Tenant: "acme", APIKey: "sk_live_51HxYzAbCdEfGhIjKlMnOpQr", Endpoint: "/api/items"}
	var sc Scratch
	b.ReportAllocs()
	for b.Loop() {
		if ls := snap.Resolve(&r, now, &sc); len(ls) != 1 || ls[0].Spec.Limit != 5 {
			b.Fatal("want the API key's override")
		}
	}
}

// BenchmarkCompileWith compiles the policy files with a control store of 10,000 overrides and
// 10,000 identity assignments: what a node does at every control change.
func BenchmarkCompileWith(b *testing.B) {
	f := mustFiles(b, controlFiles)
	st := bigState(10000)
	b.ReportAllocs()
	for b.Loop() {
		if _, skipped := CompileWith(f, st, now); len(skipped) > 0 {
			b.Fatal(skipped)
		}
	}
}

// BenchmarkAssign is identity assignment on the hot path: a snapshot without assignments, and
// one with 10,000, for a request none applies to and for an assigned API key.
func BenchmarkAssign(b *testing.B) {
	f := mustFiles(b, controlFiles)
	empty := mustCompileWith(b, f, nil, now)
	big := mustCompileWith(b, f, bigState(10000), now)
	var scratch Request
	for _, c := range []struct {
		name string
		s    *Snapshot
		r    Request
	}{
		{"none", empty, Request{Tenant: "acme", User: "u1", APIKey: "k"}},
		{"10k/unassigned", big, Request{Tenant: "acme", User: "u1", APIKey: "k"}},
		{"10k/assigned-key", big, Request{APIKey: "key-42", Tier: "premium"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.s.Assign(&c.r, &scratch)
			}
		})
	}
}

// BenchmarkCompileWithDomains is what 100 domains of the control store, each of 20 descriptors
// with a nested one, add to every compile: parsed again each time, or (as the follower
// compiles, with a DomainCache) looked up, none having changed.
func BenchmarkCompileWithDomains(b *testing.B) {
	f := mustFiles(b, controlFiles)
	st := &State{Version: 1}
	for d := range 100 {
		var desc []string
		for i := range 20 {
			desc = append(desc, fmt.Sprintf(`{"key":"path","value":"/api/v%d/*","rate_limit":{"unit":"second","requests_per_unit":%d},`+
				`"descriptors":[{"key":"remote_address","rate_limit":{"unit":"minute","requests_per_unit":100}}]}`, i, 10+i))
		}
		name := fmt.Sprint("domain-", d)
		st.Domains = append(st.Domains, APIDomain{Name: name, Body: []byte(`{"domain":"` + name + `","descriptors":[` + strings.Join(desc, ",") + `]}`)})
	}
	for _, bc := range []struct {
		name  string
		cache *DomainCache
	}{{"parsed", nil}, {"cached", &DomainCache{}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s, skipped := CompileWith(f, st, now, WithDomainCache(bc.cache)); len(skipped) > 0 || len(s.Envoy().Domains()) != 100 {
					b.Fatal(skipped)
				}
			}
		})
	}
}
