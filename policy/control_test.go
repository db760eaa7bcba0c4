package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy/envoyconf"
)

const controlFiles = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 10, period: 1s, tiers: {gold: {limit: 100}, free: {limit: 2}}}
  - {name: acme-only, match: {tenant: acme}, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}
overrides:
  - {tenant: beta, type: custom, limit: 4, expires_at: "2027-01-01T00:00:00Z", reason: from the file}
exemptions:
  - {user: health}
`

func mustFiles(t testing.TB, yml string) *Files {
	t.Helper()
	f, err := ParseFiles(map[string][]byte{"policy.yaml": []byte(yml)})
	if err != nil {
		t.Fatalf("ParseFiles: %v", err)
	}
	return f
}

func mustCompileWith(t testing.TB, f *Files, st *State, at time.Time) *Snapshot {
	t.Helper()
	s, skipped := CompileWith(f, st, at)
	if len(skipped) > 0 {
		t.Fatalf("CompileWith left out %v", skipped)
	}
	return s
}

// limitOf returns the limit of the named rule for r (after Assign), or -1 when the rule does
// not apply, and whether it is banned.
func limitOf(s *Snapshot, r Request, rule string) (int64, bool) {
	var sc Scratch
	var scratch Request
	for _, l := range s.Resolve(s.Assign(&r, &scratch), now, &sc) {
		if l.Rule.Name == rule {
			return l.Spec.Limit, l.Banned
		}
	}
	return -1, false
}

func ptr[T any](v T) *T { return &v }

// TestCompileWithEveryKind: each kind of control store entry takes effect beside the files'.
func TestCompileWithEveryKind(t *testing.T) {
	t.Parallel()
	f := mustFiles(t, controlFiles)
	expires := now.Add(time.Hour)
	st := &State{
		Version: 7,
		Rules: []APIRule{{Name: "api-per-key", Body: json.RawMessage(
			`{"key": ["api_key"], "algorithm": "gcra", "limit": 5, "period": "1m", "tiers": {"gold": {"limit": 50}}}`)}},
		Overrides: []StateOverride{
			{ID: 1, Override: Override{Tenant: "acme", Rule: "per-user", Type: OverrideCustom, Limit: 3, ExpiresAt: expires, Source: SourceAPI, Reason: "r"}},
			{ID: 2, Override: Override{User: "mallory", Type: OverrideBan, ExpiresAt: expires, Source: SourceAutomatic}},
		},
		Exemptions: []StateExemption{{ID: 1, Exemption: Exemption{APIKey: "partner-key"}}, {ID: 2, Exemption: Exemption{IP: "192.0.2.0/24"}}},
		Identities: []Identity{
			{Kind: IdentityAPIKey, Value: "k-gold", Tier: "gold"},
			{Kind: IdentityUser, Value: "ann", Trust: ptr(0.5)},
		},
	}
	s := mustCompileWith(t, f, st, now)
	if want := f.Version + ".7"; s.Version != want || s.FilesVersion() != f.Version || s.ControlVersion() != 7 {
		t.Errorf("version %q (files %q, control %d), want %q", s.Version, s.FilesVersion(), s.ControlVersion(), want)
	}
	for _, c := range []struct {
		name   string
		req    Request
		rule   string
		limit  int64
		banned bool
	}{
		{"file rule", Request{Tenant: "zeta", User: "u"}, "per-user", 10, false},
		{"api rule", Request{APIKey: "k1"}, "api-per-key", 5, false},
		{"api rule takes the assigned tier", Request{APIKey: "k-gold"}, "api-per-key", 50, false},
		{"api override", Request{Tenant: "acme", User: "u"}, "per-user", 3, false},
		{"api override names its rule only", Request{Tenant: "acme", User: "u"}, "acme-only", 1000, false},
		{"file override", Request{Tenant: "beta", User: "u"}, "per-user", 4, false},
		{"automatic ban", Request{Tenant: "zeta", User: "mallory"}, "per-user", 10, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			limit, banned := limitOf(s, c.req, c.rule)
			if limit != c.limit || banned != c.banned {
				t.Errorf("limit %d banned %v, want %d %v", limit, banned, c.limit, c.banned)
			}
		})
	}
	var sc Scratch
	if l := s.Resolve(&Request{Tenant: "acme", User: "u"}, now, &sc)[0]; l.Override == nil || l.Override.Source != "api" {
		t.Errorf("api override source = %+v", l.Override)
	}
	for _, c := range []struct {
		req    Request
		exempt bool
	}{
		{Request{User: "health"}, true},
		{Request{APIKey: "partner-key"}, true},
		{Request{IP: "192.0.2.9"}, true},
		{Request{IP: "198.51.100.1"}, false},
	} {
		if got := s.Exempt(&c.req); got != c.exempt {
			t.Errorf("Exempt(%+v) = %v", c.req, got)
		}
	}
	if tr, ok := s.Trust(IdentityUser, "ann"); !ok || tr != 0.5 {
		t.Errorf("Trust(user ann) = %v, %v", tr, ok)
	}
	if _, ok := s.Trust(IdentityUser, "bob"); ok {
		t.Error("Trust(user bob) is set")
	}
	// Files alone: control version 0, and nothing of the state.
	alone := mustCompileWith(t, f, nil, now)
	if alone.Version != f.Version+".0" || alone.Rule("api-per-key") != nil {
		t.Errorf("files alone: version %q, rules %d", alone.Version, len(alone.Rules()))
	}
}

// TestAssign: assigned values win over the request's own; the tier comes from the API key,
// then the user, then the tenant (the assigned ones), then the request.
func TestAssign(t *testing.T) {
	t.Parallel()
	ids := []Identity{
		{Kind: IdentityAPIKey, Value: "k-gold", Tier: "gold"},
		{Kind: IdentityAPIKey, Value: "k-acme", Tenant: "acme", User: "bob"},
		{Kind: IdentityAPIKey, Value: "k-acme-free", Tenant: "acme", Tier: "free"},
		{Kind: IdentityAPIKey, Value: "k-trust", Trust: ptr(0.9)},
		{Kind: IdentityUser, Value: "bob", Tier: "silver"},
		{Kind: IdentityUser, Value: "eve", Tier: "free"},
		{Kind: IdentityTenant, Value: "acme", Tier: "bronze"},
		{Kind: IdentityTenant, Value: "beta", Tier: "free"},
	}
	s := mustCompileWith(t, mustFiles(t, controlFiles), &State{Version: 1, Identities: ids}, now)
	for _, c := range []struct {
		name string
		req  Request
		want Request // zero: r itself
	}{
		{"nothing assigned", Request{Tenant: "zeta", User: "u", APIKey: "k", Tier: "premium"}, Request{}},
		{"only a trust score", Request{APIKey: "k-trust", Tier: "premium"}, Request{}},
		{"tenant tier beats the claimed one", Request{Tenant: "beta", Tier: "premium"}, Request{Tenant: "beta", Tier: "free"}},
		{"user tier beats the tenant's", Request{Tenant: "acme", User: "eve", Tier: "premium"}, Request{Tenant: "acme", User: "eve", Tier: "free"}},
		{"api key tier beats the user's", Request{User: "eve", APIKey: "k-gold"}, Request{User: "eve", APIKey: "k-gold", Tier: "gold"}},
		{"api key assigns tenant and user; the user's tier follows", Request{Tenant: "evil", User: "eve", APIKey: "k-acme", Tier: "premium"},
			Request{Tenant: "acme", User: "bob", APIKey: "k-acme", Tier: "silver"}},
		{"api key assigns a tenant; its own tier wins", Request{APIKey: "k-acme-free", Tier: "premium"},
			Request{Tenant: "acme", APIKey: "k-acme-free", Tier: "free"}},
		{"request tier kept when nothing assigns one", Request{Tenant: "zeta", User: "bob2", Tier: "premium"}, Request{}},
		{"same values: r itself", Request{Tenant: "beta", Tier: "free"}, Request{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.req
			var scratch Request
			got := s.Assign(&in, &scratch)
			if reflect.DeepEqual(c.want, Request{}) {
				if got != &in {
					t.Fatalf("Assign changed the request to %+v", *got)
				}
				return
			}
			if got != &scratch || !reflect.DeepEqual(*got, c.want) {
				t.Errorf("Assign = %+v, want %+v", *got, c.want)
			}
			if !reflect.DeepEqual(in, c.req) {
				t.Errorf("Assign modified its input: %+v", in)
			}
		})
	}
	// The assigned tier and tenant reach the rules: acme's rule applies to k-acme's requests
	// whatever tenant they claim, with the tier of bob (silver: no such tier, the base limit).
	if limit, _ := limitOf(s, Request{Tenant: "evil", APIKey: "k-acme"}, "acme-only"); limit != 1000 {
		t.Errorf("acme-only for k-acme: limit %d", limit)
	}
	if limit, _ := limitOf(s, Request{User: "u", APIKey: "k-gold", Tier: "free"}, "per-user"); limit != 100 {
		t.Errorf("per-user for k-gold claiming free: limit %d, want gold's 100", limit)
	}
}

// TestAPIKeyTenantBringsTenantPolicy: an API key's assigned tenant makes the tenant's
// overrides and exemptions apply.
func TestAPIKeyTenantBringsTenantPolicy(t *testing.T) {
	t.Parallel()
	st := &State{
		Version: 3,
		Overrides: []StateOverride{
			{ID: 1, Override: Override{Tenant: "acme", Type: OverrideBan, ExpiresAt: now.Add(time.Hour), Source: SourceAPI}},
		},
		Exemptions: []StateExemption{{ID: 1, Exemption: Exemption{Tenant: "partner"}}},
		Identities: []Identity{
			{Kind: IdentityAPIKey, Value: "k-acme", Tenant: "acme"},
			{Kind: IdentityAPIKey, Value: "k-partner", Tenant: "partner"},
		},
	}
	s := mustCompileWith(t, mustFiles(t, controlFiles), st, now)
	var scratch Request
	if _, banned := limitOf(s, Request{APIKey: "k-acme", User: "u"}, "per-user"); !banned {
		t.Error("the tenant's ban does not apply to its API key")
	}
	if _, banned := limitOf(s, Request{APIKey: "k-other", User: "u"}, "per-user"); banned {
		t.Error("the ban applies to another key")
	}
	if !s.Exempt(s.Assign(&Request{APIKey: "k-partner"}, &scratch)) {
		t.Error("the tenant's exemption does not apply to its API key")
	}
	if s.Exempt(s.Assign(&Request{APIKey: "k-acme"}, &scratch)) {
		t.Error("another tenant's key is exempt")
	}
}

// TestCompileWithLeavesOutBadEntries: an API rule whose name a file rule has, a rule that
// does not compile, an override naming no rule and an identity that breaks the store's
// rules are left out and reported; everything else applies.
func TestCompileWithLeavesOutBadEntries(t *testing.T) {
	t.Parallel()
	f := mustFiles(t, controlFiles)
	st := &State{
		Version: 9,
		Rules: []APIRule{
			{Name: "good", Body: json.RawMessage(`{"key": [], "limit": 7, "period": "1s"}`)},
			{Name: "per-user", Body: json.RawMessage(`{"key": [], "limit": 1, "period": "1s"}`)},
			{Name: "typo", Body: json.RawMessage(`{"key": [], "limitt": 1, "period": "1s"}`)},
		},
		Overrides: []StateOverride{
			{ID: 4, Override: Override{Tenant: "t", Rule: "gone", Type: OverrideBan, ExpiresAt: now.Add(time.Hour), Source: SourceAPI}},
			{ID: 5, Override: Override{Tenant: "t", Rule: "good", Type: OverrideCustom, Limit: 1, ExpiresAt: now.Add(time.Hour), Source: SourceAPI}},
		},
		Identities: []Identity{{Kind: IdentityUser, Value: "u", Tenant: "x"}},
	}
	s, skipped := CompileWith(f, st, now)
	var got []string
	for _, err := range skipped {
		var se *SkippedError
		if !errors.As(err, &se) {
			t.Fatalf("%v is not a *SkippedError", err)
		}
		got = append(got, se.Kind+" "+se.ID)
	}
	if want := `rule "per-user",rule "typo",override 4,identity user/u`; strings.Join(got, ",") != want {
		t.Errorf("left out %q, want %q\n%v", strings.Join(got, ","), want, skipped)
	}
	if !strings.Contains(fmt.Sprint(skipped), "limitt: unknown field") {
		t.Errorf("the typo's error does not name the field: %v", skipped)
	}
	if limit, _ := limitOf(s, Request{Tenant: "z", User: "u"}, "per-user"); limit != 10 {
		t.Errorf("per-user limit %d: the file's rule must win", limit)
	}
	if limit, _ := limitOf(s, Request{Tenant: "t"}, "good"); limit != 1 {
		t.Errorf("good limit %d for t, want the override's 1", limit)
	}
	if s.Version != f.Version+".9" {
		t.Errorf("version %q", s.Version)
	}
}

// TestExemptionExpiresOnTime: an exemption applies until its expiry, which NextExpiry
// announces, and a compile at that instant leaves it out.
func TestExemptionExpiresOnTime(t *testing.T) {
	t.Parallel()
	f := mustFiles(t, controlFiles)
	soon, later := now.Add(time.Minute), now.Add(time.Hour)
	st := &State{Version: 2, Exemptions: []StateExemption{
		{ID: 1, Exemption: Exemption{User: "a"}, ExpiresAt: &later},
		{ID: 2, Exemption: Exemption{User: "b"}, ExpiresAt: &soon},
		{ID: 3, Exemption: Exemption{User: "c"}},
	}}
	exempt := func(s *Snapshot) string {
		var out []string
		for _, u := range []string{"a", "b", "c"} {
			if s.Exempt(&Request{User: u}) {
				out = append(out, u)
			}
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		name   string
		at     time.Time
		exempt string
		next   time.Time
	}{
		{"before", now, "a,b,c", soon},
		{"a microsecond before b's expiry", soon.Add(-time.Microsecond), "a,b,c", soon},
		{"at b's expiry", soon, "a,c", later},
		{"after both", later.Add(time.Second), "c", time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := mustCompileWith(t, f, st, c.at)
			if got := exempt(s); got != c.exempt {
				t.Errorf("exempt %q, want %q", got, c.exempt)
			}
			if !s.NextExpiry().Equal(c.next) {
				t.Errorf("NextExpiry %v, want %v", s.NextExpiry(), c.next)
			}
		})
	}
}

// TestOverrideSources: file overrides are "file" (and "operator", the older spelling, reads
// as it); the control store's are "api" or "automatic"; a file cannot claim "api".
func TestOverrideSources(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		source, want string
	}{{"", "file"}, {"file", "file"}, {"operator", "file"}, {"automatic", "automatic"}, {"api", ""}, {"bogus", ""}} {
		t.Run(c.source, func(t *testing.T) {
			yml := fmt.Sprintf(`
rules: [{name: r, key: [tenant], limit: 5, period: 1s}]
overrides: [{tenant: t, type: ban, expires_at: "2027-01-01T00:00:00Z", source: %q}]
`, c.source)
			cfg, err := ParseConfig("p.yaml", []byte(yml))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Compile(cfg)
			if c.want == "" {
				if err == nil || !strings.Contains(err.Error(), "source") {
					t.Fatalf("source %q accepted: %v", c.source, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var sc Scratch
			if _, src, _ := s.Resolve(&Request{Tenant: "t"}, now, &sc)[0].OverrideReason(); src != c.want {
				t.Errorf("source %q, want %q", src, c.want)
			}
		})
	}
	s := mustCompileWith(t, mustFiles(t, controlFiles), nil, now)
	if err := s.CheckOverride(&Override{Tenant: "t", Type: OverrideBan, ExpiresAt: now, Source: "file"}); err == nil {
		t.Error("CheckOverride accepted source file from the control store")
	}
	if err := s.CheckOverride(&Override{Tenant: "t", Type: OverrideMultiplier, Value: 2000, ExpiresAt: now, Source: SourceAPI}); err == nil || !strings.Contains(err.Error(), "value") {
		t.Errorf("CheckOverride(multiplier 2000) = %v", err)
	}
	if err := s.CheckOverride(&Override{Tenant: "t", Rule: "per-user", Type: OverrideBan, ExpiresAt: now, Source: SourceAPI}); err != nil {
		t.Errorf("CheckOverride(valid) = %v", err)
	}
	if err := CheckExemption(&Exemption{IP: "10.0.0.0/33"}); err == nil {
		t.Error("CheckExemption accepted a bad CIDR")
	}
}

// TestParseRule: API rules are read as strictly as file rules, each mistake naming its field.
func TestParseRule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, body, field string
	}{
		{"valid", `{"key": ["user"], "algorithm": "gcra", "limit": 5, "period": "1m", "burst": 10, "soft": 80, "tiers": {"free": {"limit": 1}}, "shadow": true, "on_store_error": "local", "match": {"endpoint": "/api/*"}}`, ""},
		{"name given and equal", `{"name": "r", "key": [], "limit": 5, "period": "1s"}`, ""},
		{"name differs", `{"name": "other", "key": [], "limit": 5, "period": "1s"}`, "name"},
		{"unknown field", `{"key": [], "limit": 5, "period": "1s", "limitt": 3}`, "limitt"},
		{"field in another case", `{"key": [], "Limit": 5, "period": "1s"}`, "Limit"},
		{"field given twice", `{"key": [], "limit": 5, "limit": 6, "period": "1s"}`, "limit"},
		{"wrong type", `{"key": [], "limit": "5", "period": "1s"}`, "limit"},
		{"fraction", `{"key": [], "limit": 5.5, "period": "1s"}`, "limit"},
		{"bad period", `{"key": [], "limit": 5, "period": "soon"}`, "period"},
		{"bad tier period", `{"key": [], "limit": 5, "period": "1s", "tiers": {"free": {"period": "x"}}}`, "tiers.free.period"},
		{"bad key", `{"key": ["nope"], "limit": 5, "period": "1s"}`, "key[0]"},
		{"missing limit", `{"key": [], "period": "1s"}`, "limit"},
		{"not an object", `[1]`, "rule"},
		{"null", `null`, "rule"},
		{"invalid JSON", `{"key": [}`, "rule"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseRule("r", []byte(c.body))
			if c.field == "" {
				if err != nil || r.Name != "r" {
					t.Fatalf("ParseRule = %+v, %v", r, err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("error %v, want one naming %q", err, c.field)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

// TestParseRuleZeroIsOutOfRange: through the API as in a file, a limit or period given as 0
// is out of range; "required" is for one not given.
func TestParseRuleZeroIsOutOfRange(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"key": [], "limit": 0, "period": "1s"}`: "limit: must be from 1 to 1099511627776, got 0",
		`{"key": [], "period": "1s"}`:             "limit: required: a whole number from 1 to 1099511627776",
		`{"key": [], "limit": 1, "period": "0s"}`: "period: must be from 1ms to 400d (e.g. 1s, 1m, 1h, 1d), got 0s",
		`{"key": [], "limit": 1}`:                 "period: required (e.g. 1s, 1m, 1h, 1d)",
	} {
		if _, err := ParseRule("r", []byte(body)); err == nil || err.Error() != want {
			t.Errorf("ParseRule(%s) = %v, want %q", body, err, want)
		}
	}
}

// TestVersion pins the form of a compiled policy's version, which nodes and the admin API
// compare.
func TestVersion(t *testing.T) {
	t.Parallel()
	if got := Version("3f9a1c02b7e4", 42); got != "3f9a1c02b7e4.42" {
		t.Errorf("Version = %q", got)
	}
	f := mustFiles(t, controlFiles)
	if f.Snapshot().Version != f.Version || len(f.Version) != 12 {
		t.Errorf("files version %q, snapshot %q", f.Version, f.Snapshot().Version)
	}
}

// bigState is a control state of n overrides (one per tenant) and n identity assignments
// (n/2 API keys mapped to a tenant and a tier, n/2 users given a tier).
func bigState(n int) *State {
	st := &State{Version: 1}
	for i := range n {
		st.Overrides = append(st.Overrides, StateOverride{ID: int64(i + 1), Override: Override{Tenant: fmt.Sprintf("tenant-%d", i), Type: OverrideMultiplier, Value: 0.5,
			ExpiresAt: now.Add(time.Hour), Source: SourceAPI, Reason: "bench",
		}})
		if i%2 == 0 {
			st.Identities = append(st.Identities, Identity{Kind: IdentityAPIKey, Value: fmt.Sprintf("key-%d", i), Tenant: fmt.Sprintf("tenant-%d", i), Tier: "gold"})
		} else {
			st.Identities = append(st.Identities, Identity{Kind: IdentityUser, Value: fmt.Sprintf("user-%d", i), Tier: "free"})
		}
	}
	return st
}

// TestAssignAllocatesNothing holds Assign to its promise on a large snapshot.
func TestAssignAllocatesNothing(t *testing.T) {
	s := mustCompileWith(t, mustFiles(t, controlFiles), bigState(10000), now)
	reqs := []Request{{APIKey: "key-42", Tier: "premium"}, {User: "user-43"}, {Tenant: "x", User: "y"}}
	var scratch Request
	if n := testing.AllocsPerRun(100, func() {
		for i := range reqs {
			s.Assign(&reqs[i], &scratch)
		}
	}); n != 0 {
		t.Errorf("Assign allocates %v times", n)
	}
}

// TestCompileWithDomains: Envoy domains of the control store join the files' ones; a domain
// a file defines keeps the file's configuration, and a domain that does not load, or whose
// configuration names another domain, is left out with the reason.
func TestCompileWithDomains(t *testing.T) {
	t.Parallel()
	f, err := ParseFiles(map[string][]byte{
		"policy.yaml": []byte(controlFiles),
		"edge.yaml":   []byte("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	limit := func(rpu int) []byte {
		return fmt.Appendf(nil, `{"domain":"%%s","descriptors":[{"key":"k","rate_limit":{"unit":"minute","requests_per_unit":%d}}]}`, rpu)
	}
	body := func(name string, rpu int) []byte { return fmt.Appendf(nil, string(limit(rpu)), name) }
	st := &State{Version: 3, Domains: []APIDomain{
		{Name: "api", Body: body("api", 7)},
		{Name: "edge", Body: body("edge", 99)},
		{Name: "other", Body: body("elsewhere", 5)},
		{Name: "typo", Body: []byte(`{"domain":"typo","descriptor":[]}`)},
	}}
	s, skipped := CompileWith(f, st, now)
	var got []string
	for _, err := range skipped {
		var se *SkippedError
		if !errors.As(err, &se) {
			t.Fatalf("%v is not a *SkippedError", err)
		}
		got = append(got, se.Kind+" "+se.ID)
	}
	if want := `domain "edge",domain "other",domain "typo"`; strings.Join(got, ",") != want {
		t.Errorf("left out %q, want %q\n%v", strings.Join(got, ","), want, skipped)
	}
	for _, want := range []string{"a policy file defines this domain", `for domain "elsewhere"`, "descriptor: unknown field"} {
		if !strings.Contains(fmt.Sprint(skipped), want) {
			t.Errorf("the reasons %v do not say %q", skipped, want)
		}
	}
	env := s.Envoy()
	if got := strings.Join(env.Domains(), ","); got != "api,edge" {
		t.Errorf("domains %s, want api,edge", got)
	}
	if m := env.Match("api", []envoyconf.Entry{{Key: "k", Value: "v"}}); m.Limit == nil || m.Limit.RequestsPerUnit != 7 {
		t.Errorf("api matches %+v, want the API's 7 per minute", m.Limit)
	}
	if m := env.Match("edge", []envoyconf.Entry{{Key: "k", Value: "v"}}); m.Limit == nil || m.Limit.RequestsPerUnit != 1 {
		t.Errorf("edge matches %+v, want the file's 1 per second", m.Limit)
	}
	if files := f.Snapshot().Envoy(); len(files.Domains()) != 1 {
		t.Errorf("the files' configuration changed: %v", files.Domains())
	}
	if s2, _ := CompileWith(f, &State{Version: 4}, now); len(s2.Envoy().Domains()) != 1 {
		t.Errorf("a deleted domain stays: %v", s2.Envoy().Domains())
	}
}

// TestDomainCache: with a DomainCache, a compile reuses the domains whose body did not change
// (the same compiled limits), loads the changed ones, and still leaves out a bad one.
func TestDomainCache(t *testing.T) {
	t.Parallel()
	f := mustFiles(t, controlFiles)
	body := func(name string, rpu int) []byte {
		return fmt.Appendf(nil, `{"domain":%q,"descriptors":[{"key":"k","rate_limit":{"unit":"minute","requests_per_unit":%d}}]}`, name, rpu)
	}
	limit := func(s *Snapshot, domain string) *envoyconf.Limit {
		return s.Envoy().Match(domain, []envoyconf.Entry{{Key: "k", Value: "v"}}).Limit
	}
	var c DomainCache
	st := &State{Version: 1, Domains: []APIDomain{{Name: "a", Body: body("a", 1)}, {Name: "b", Body: body("b", 2)}, {Name: "bad", Body: []byte(`{"domain":"bad","x":1}`)}}}
	s1, skipped := CompileWith(f, st, now, WithDomainCache(&c))
	if len(skipped) != 1 {
		t.Fatalf("skipped %v, want the bad domain", skipped)
	}
	st2 := &State{Version: 2, Domains: []APIDomain{{Name: "a", Body: body("a", 1)}, {Name: "b", Body: body("b", 3)}, {Name: "bad", Body: []byte(`{"domain":"bad","x":1}`)}}}
	s2, skipped := CompileWith(f, st2, now, WithDomainCache(&c))
	if len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "x: unknown field") {
		t.Errorf("skipped %v, want the bad domain again, with its reason", skipped)
	}
	if limit(s2, "a") != limit(s1, "a") {
		t.Error("the unchanged domain a was loaded again")
	}
	if l := limit(s2, "b"); l == limit(s1, "b") || l.RequestsPerUnit != 3 {
		t.Errorf("the changed domain b: %+v, want it loaded again with 3", l)
	}
	// A deleted domain is forgotten, and one put back under its name is loaded anew.
	CompileWith(f, &State{Version: 3, Domains: st2.Domains[:1]}, now, WithDomainCache(&c))
	if len(c.m) != 1 {
		t.Errorf("the cache holds %d domains after b and bad were deleted, want 1", len(c.m))
	}
	s4, _ := CompileWith(f, &State{Version: 4, Domains: st2.Domains[:2]}, now, WithDomainCache(&c))
	if l := limit(s4, "b"); l == nil || l == limit(s2, "b") || l.RequestsPerUnit != 3 {
		t.Errorf("b put back: %+v", l)
	}
}
