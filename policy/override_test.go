package policy

import (
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"
)

// shapeFields are the four attributes an override can target, with a value each that a test
// request carries.
var shapeFields = [...]struct {
	name, value string
	bit         shape
}{
	{"api_key", "sk_live_override_secret", shapeAPIKey},
	{"user", "john", shapeUser},
	{"tenant", "acme", shapeTenant},
	{"endpoint", "/api/items", shapeEndpoint},
}

// overrideYAML writes an override of shape sh that sets limit.
func overrideYAML(sh shape, limit int) string {
	var b strings.Builder
	b.WriteString("  - {")
	for _, f := range shapeFields {
		if sh&f.bit != 0 {
			fmt.Fprintf(&b, "%s: %q, ", f.name, f.value)
		}
	}
	fmt.Fprintf(&b, "type: custom, limit: %d, expires_at: \"2027-01-01T00:00:00Z\"}\n", limit)
	return b.String()
}

func shapeName(sh shape) string {
	var parts []string
	for _, f := range shapeFields {
		if sh&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	return strings.Join(parts, "+")
}

// TestOverrideShapeOrder pins the documented order of all 15 target shapes, most specific
// first: more attributes win, then api_key > user > tenant > endpoint, attribute by attribute.
// It includes the documented order: tenant+user+endpoint, tenant+user, tenant+endpoint, tenant.
func TestOverrideShapeOrder(t *testing.T) {
	t.Parallel()
	want := []string{
		"api_key+user+tenant+endpoint",
		"api_key+user+tenant", "api_key+user+endpoint", "api_key+tenant+endpoint", "user+tenant+endpoint",
		"api_key+user", "api_key+tenant", "api_key+endpoint", "user+tenant", "user+endpoint", "tenant+endpoint",
		"api_key", "user", "tenant", "endpoint",
	}
	// Order them by moreSpecific alone (insertion sort: it must be a strict total order).
	shapes := make([]shape, 0, 15)
	for sh := shape(1); sh < 16; sh++ {
		i := len(shapes)
		for i > 0 && sh.moreSpecific(shapes[i-1]) {
			i--
		}
		shapes = append(shapes[:i], append([]shape{sh}, shapes[i:]...)...)
	}
	var got []string
	for _, sh := range shapes {
		got = append(got, shapeName(sh))
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("order:\n got %s\nwant %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

// TestOverrideEveryPair puts overrides of two different target shapes in one policy, in both
// orders, and checks that a request matching both gets the more specific one's limit: every
// pair of the 15 non-empty combinations of tenant, user, api_key and endpoint.
func TestOverrideEveryPair(t *testing.T) {
	t.Parallel()
	req := Request{Tenant: "acme", User: "john", APIKey: "sk_live_override_secret", Endpoint: "/api/items"}
	for a := shape(1); a < 16; a++ {
		for b := shape(1); b < 16; b++ {
			if a == b {
				continue
			}
			t.Run(shapeName(a)+" vs "+shapeName(b), func(t *testing.T) {
				t.Parallel()
				// Limits say which override applied: 10+a for a, 100+b for b.
				s := mustCompile(t, "rules:\n  - {name: r, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}\noverrides:\n"+
					overrideYAML(a, 10+int(a))+overrideYAML(b, 100+int(b)))
				var sc Scratch
				got := s.Resolve(&req, now, &sc)[0].Spec.Limit
				want, winner := int64(100+int(b)), b
				if a.moreSpecific(b) {
					want, winner = int64(10+int(a)), a
				}
				if got != want {
					t.Errorf("limit %d, want %d from the %s override", got, want, shapeName(winner))
				}
				// Each override alone applies to the request, whatever attributes it leaves out.
				if bits.OnesCount8(uint8(a)) < 4 {
					only := mustCompile(t, "rules:\n  - {name: r, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}\noverrides:\n"+overrideYAML(a, 7))
					if got := only.Resolve(&req, now, &sc)[0].Spec.Limit; got != 7 {
						t.Errorf("the %s override alone: limit %d, want 7", shapeName(a), got)
					}
				}
			})
		}
	}
}

// TestOverrideTargetsMustAllMatch: a request lacking one attribute of a target, or with
// another value for it, is not that target's.
func TestOverrideTargetsMustAllMatch(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: r, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}
overrides:
  - {user: john, endpoint: /e, type: custom, limit: 1, expires_at: "2027-01-01T00:00:00Z"}
  - {api_key: sk_live_1, type: custom, limit: 2, expires_at: "2027-01-01T00:00:00Z"}
`)
	var sc Scratch
	cases := []struct {
		name  string
		req   Request
		limit int64
	}{
		{"user and endpoint, with a tenant", Request{Tenant: "acme", User: "john", Endpoint: "/e"}, 1},
		{"user without the endpoint", Request{Tenant: "acme", User: "john"}, 1000},
		{"endpoint of another user", Request{Tenant: "acme", User: "mary", Endpoint: "/e"}, 1000},
		{"api key", Request{Tenant: "acme", APIKey: "sk_live_1"}, 2},
		{"another api key", Request{Tenant: "acme", APIKey: "sk_live_2"}, 1000},
		{"a user named like the api key", Request{Tenant: "acme", User: "sk_live_1"}, 1000},
		{"api key beats user+endpoint (same count, api_key first)", Request{Tenant: "acme", User: "john", Endpoint: "/e", APIKey: "sk_live_1"}, 1},
	}
	for _, c := range cases {
		if got := s.Resolve(&c.req, now, &sc)[0].Spec.Limit; got != c.limit {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.limit)
		}
	}
	// With no rule matching, a ban on an API key still denies it.
	banned := mustCompile(t, "rules: []\noverrides:\n  - {api_key: sk_live_1, type: ban, expires_at: \"2027-01-01T00:00:00Z\", reason: leaked}\n")
	if _, reason, ok := banned.BanFor(&Request{APIKey: "sk_live_1"}, now); !ok || reason != "leaked" {
		t.Errorf("BanFor(api key) = %q, %v", reason, ok)
	}
	if _, _, ok := banned.BanFor(&Request{APIKey: "sk_live_2"}, now); ok {
		t.Error("another API key banned")
	}
}

// TestOverrideHoldsNoAPIKey: the compiled override keeps the API key hashed, never in clear,
// so nothing that prints or stores a decision's override can leak it.
func TestOverrideHoldsNoAPIKey(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: r, key: [tenant], limit: 10, period: 1m}
overrides:
  - {api_key: sk_live_do_not_leak, type: multiplier, value: 2, expires_at: "2027-01-01T00:00:00Z"}
`)
	for tgt, list := range s.overrides {
		for _, o := range list {
			if dump := fmt.Sprintf("%+v %+v", tgt, *o); strings.Contains(dump, "do_not_leak") || tgt.apiKey == "" {
				t.Errorf("compiled override holds the key: %s", dump)
			}
		}
	}
	var sc Scratch
	l := s.Resolve(&Request{Tenant: "t", APIKey: "sk_live_do_not_leak"}, now, &sc)[0]
	if l.Override == nil || l.Spec.Limit != 20 {
		t.Fatalf("override not applied: %+v", l)
	}
}

// TestOverrideLookupAllocates nothing: neither Resolve nor BanFor, API keys included.
func TestOverrideLookupAllocates(t *testing.T) {
	s := mustCompile(t, `
rules:
  - {name: r, match: {endpoint: /api/*}, key: [api_key], limit: 10, period: 1m}
overrides:
  - {api_key: sk_live_1, type: ban, expires_at: "2027-01-01T00:00:00Z"}
  - {api_key: sk_live_1, endpoint: /api/x, type: multiplier, value: 2, expires_at: "2027-01-01T00:00:00Z"}
  - {tenant: acme, user: john, type: custom, limit: 3, expires_at: "2027-01-01T00:00:00Z"}
`)
	var sc Scratch
	in := Request{Tenant: "acme", User: "john", APIKey: "sk_live_1", Endpoint: "/api/x"}
	out := Request{Tenant: "acme", APIKey: "sk_live_1", Endpoint: "/health"}
	s.Resolve(&in, now, &sc) // grow the scratch buffers once
	if n := testing.AllocsPerRun(100, func() {
		if l := s.Resolve(&in, now, &sc); len(l) != 1 || l[0].Spec.Limit != 20 {
			t.Fatalf("limits %+v", l)
		}
	}); n != 0 {
		t.Errorf("Resolve with overrides: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, _, ok := s.BanFor(&out, now); !ok {
			t.Fatal("not banned")
		}
	}); n != 0 {
		t.Errorf("BanFor: %v allocations", n)
	}
}

// TestResolveNowReadsClockOnlyForOverrides: the clock is read once for a request that an
// override matches, with the override applied at that time, and not at all for the others.
func TestResolveNowReadsClockOnlyForOverrides(t *testing.T) {
	s := mustCompile(t, `
rules:
  - {name: a, key: [tenant, user], limit: 10, period: 1s}
  - {name: b, key: [tenant], limit: 10, period: 1s}
overrides:
  - {tenant: acme, type: custom, limit: 3, expires_at: "2026-11-23T12:00:00Z"}
`)
	reads := 0
	at := now.Add(-time.Second)
	clock := func() time.Time { reads++; return at }
	var sc Scratch
	ls, got := s.ResolveNow(&Request{Tenant: "zeta", User: "u"}, clock, &sc)
	if reads != 0 || !got.IsZero() || len(ls) != 2 {
		t.Errorf("unmatched: %d clock reads, time %v, %d limits", reads, got, len(ls))
	}
	ls, got = s.ResolveNow(&Request{Tenant: "acme", User: "u"}, clock, &sc)
	if reads != 1 || !got.Equal(at) || ls[0].Spec.Limit != 3 || ls[1].Spec.Limit != 3 {
		t.Errorf("matched: %d clock reads, time %v, limits %d %d", reads, got, ls[0].Spec.Limit, ls[1].Spec.Limit)
	}
	at = now // the override's expiry: it no longer applies
	if ls, _ = s.ResolveNow(&Request{Tenant: "acme", User: "u"}, clock, &sc); ls[0].Spec.Limit != 10 {
		t.Errorf("expired override still applies: limit %d", ls[0].Spec.Limit)
	}
}
