package policy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func mustCompile(t testing.TB, yml string) *Snapshot {
	t.Helper()
	cfg, err := ParseConfig("policy.yaml", []byte(yml))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	s, err := Compile(cfg)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return s
}

func ruleNames(ls []Limit) string {
	var names []string
	for _, l := range ls {
		names = append(names, l.Rule.Name)
	}
	return strings.Join(names, ",")
}

const designExample = `
rules:
  - name: user-per-minute
    match: {endpoint: "/api/*"}
    key: [tenant, user]
    algorithm: sliding_window_counter
    limit: 100
    period: 1m
    soft: 80
    hard: 100
    tiers: {free: {limit: 10}, premium: {limit: 1000}}
    on_store_error: open
  - name: search-burst
    match: {endpoint: "/api/search", method: GET}
    key: [api_key]
    algorithm: token_bucket
    limit: 10
    period: 1s
    burst: 50
  - name: global
    key: []
    algorithm: gcra
    limit: 100000
    period: 1s
    shadow: true
overrides:
  - {tenant: acme, user: john, type: multiplier, value: 0.1, expires_at: "2026-12-01T00:00:00Z", reason: "abuse"}
exemptions:
  - {api_key: "internal-health"}
  - {ip: "10.0.0.0/8"}
`

func TestDesignExample(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, designExample)
	var sc Scratch
	cases := []struct {
		name  string
		req   Request
		rules string
	}{
		{"search matches all three", Request{Endpoint: "/api/search", Method: "get", APIKey: "k", User: "u"}, "user-per-minute,search-burst,global"},
		{"other api path", Request{Endpoint: "/api/items", Method: "GET", User: "u"}, "user-per-minute,global"},
		{"search by POST", Request{Endpoint: "/api/search", Method: "POST"}, "user-per-minute,global"},
		{"outside /api", Request{Endpoint: "/health"}, "global"},
	}
	for _, c := range cases {
		if got := ruleNames(s.Resolve(&c.req, now, &sc)); got != c.rules {
			t.Errorf("%s: rules %q, want %q", c.name, got, c.rules)
		}
	}
	// Tiers replace the limit, and john's multiplier scales it until it expires.
	limits := s.Resolve(&Request{Endpoint: "/api/x", Tenant: "acme", User: "mary", Tier: "premium"}, now, &sc)
	if got := limits[0].Spec.Limit; got != 1000 {
		t.Errorf("premium limit %d, want 1000", got)
	}
	limits = s.Resolve(&Request{Endpoint: "/api/x", Tenant: "acme", User: "john"}, now, &sc)
	if got := limits[0].Spec.Limit; got != 10 {
		t.Errorf("john's limit under a 0.1 multiplier = %d, want 10", got)
	}
	if reason, source, ok := limits[0].OverrideReason(); !ok || reason != "abuse" || source != "file" {
		t.Errorf("override reason %q source %q ok %v", reason, source, ok)
	}
	limits = s.Resolve(&Request{Endpoint: "/api/x", Tenant: "acme", User: "john"}, now.AddDate(0, 1, 0), &sc)
	if got := limits[0].Spec.Limit; got != 100 {
		t.Errorf("john's limit after the override expired = %d, want 100", got)
	}
	if !limits[2-1].Rule.Shadow {
		t.Error("global rule lost shadow")
	}
}

func TestExemptions(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, designExample+"  - {ip: \"2001:db8::/32\"}\n  - {tenant: internal}\n  - {user: root}\n")
	cases := []struct {
		req    Request
		exempt bool
	}{
		{Request{APIKey: "internal-health"}, true},
		{Request{IP: "10.1.2.3"}, true},
		{Request{IP: "::ffff:10.1.2.3"}, true},
		{Request{IP: "11.1.2.3"}, false},
		{Request{IP: "2001:db8::1"}, true},
		{Request{IP: "2001:db9::1"}, false},
		{Request{Tenant: "internal"}, true},
		{Request{User: "root"}, true},
		{Request{User: "rooty", APIKey: "internal"}, false},
	}
	for _, c := range cases {
		if got := s.Exempt(&c.req); got != c.exempt {
			t.Errorf("Exempt(%+v) = %v, want %v", c.req, got, c.exempt)
		}
	}
}

func TestOverridePrecedence(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: r, key: [tenant, user], algorithm: fixed_window, limit: 100, period: 1m}
  - {name: other, key: [user], algorithm: fixed_window, limit: 100, period: 1h}
overrides:
  - {tenant: acme, type: custom, limit: 1, expires_at: "2027-01-01T00:00:00Z"}
  - {tenant: acme, endpoint: /e, type: custom, limit: 2, expires_at: "2027-01-01T00:00:00Z"}
  - {tenant: acme, user: john, type: custom, limit: 3, expires_at: "2027-01-01T00:00:00Z"}
  - {tenant: acme, user: john, endpoint: /e, type: custom, limit: 4, expires_at: "2027-01-01T00:00:00Z"}
  - {tenant: acme, user: john, endpoint: /e, rule: other, type: ban, expires_at: "2027-01-01T00:00:00Z", reason: spam}
  - {tenant: acme, user: old, type: ban, expires_at: "2026-01-01T00:00:00Z"}
`)
	var sc Scratch
	cases := []struct {
		name   string
		req    Request
		limit  int64
		banned bool
	}{
		{"tenant", Request{Tenant: "acme", User: "mary"}, 1, false},
		{"tenant+endpoint", Request{Tenant: "acme", User: "mary", Endpoint: "/e"}, 2, false},
		{"tenant+user", Request{Tenant: "acme", User: "john"}, 3, false},
		{"tenant+user+endpoint", Request{Tenant: "acme", User: "john", Endpoint: "/e"}, 4, false},
		{"expired ban falls through to tenant", Request{Tenant: "acme", User: "old"}, 1, false},
		{"other tenant", Request{Tenant: "beta", User: "john", Endpoint: "/e"}, 100, false},
	}
	for _, c := range cases {
		l := s.Resolve(&c.req, now, &sc)[0]
		if l.Spec.Limit != c.limit || l.Banned != c.banned {
			t.Errorf("%s: limit %d banned %v, want %d %v", c.name, l.Spec.Limit, l.Banned, c.limit, c.banned)
		}
	}
	// The ban names rule "other": it bans that rule only.
	ls := s.Resolve(&Request{Tenant: "acme", User: "john", Endpoint: "/e"}, now, &sc)
	if ls[0].Banned || !ls[1].Banned || ls[1].BannedUntil().Year() != 2027 {
		t.Errorf("rule-scoped ban: %v %v", ls[0].Banned, ls[1].Banned)
	}
}

func TestBanWithoutRules(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules: []
overrides:
  - {tenant: acme, type: ban, expires_at: "2027-01-01T00:00:00Z", reason: fraud}
`)
	if _, reason, ok := s.BanFor(&Request{Tenant: "acme"}, now); !ok || reason != "fraud" {
		t.Errorf("BanFor(acme) = %q, %v", reason, ok)
	}
	if _, _, ok := s.BanFor(&Request{Tenant: "beta"}, now); ok {
		t.Error("beta banned")
	}
}

func TestKeysPerRule(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: a, key: [tenant, user], limit: 1, period: 1s}
  - {name: b, key: [identity], limit: 1, period: 1s}
  - {name: c, key: [ip], limit: 1, period: 1s}
  - {name: d, key: [endpoint, descriptors.plan], limit: 1, period: 1s}
`)
	var sc Scratch
	ls := s.Resolve(&Request{Tenant: "t", User: "u:1", IP: "1.2.3.4", Endpoint: "/x", Descriptors: map[string]string{"plan": "p"}}, now, &sc)
	want := []string{`:{u=u\c1}:t:u\c1`, `:{u=u\c1}:u=u\c1`, `:{i=1.2.3.4}:1.2.3.4`, `:/x:p`}
	for i, l := range ls {
		if !strings.HasSuffix(string(l.Key), want[i]) || !strings.HasPrefix(string(l.Key), "sl:"+l.Rule.Name+":") {
			t.Errorf("rule %s key %q, want suffix %q", l.Rule.Name, l.Key, want[i])
		}
	}
	// User "x" and API key "x" are different identities.
	k1 := string(s.Resolve(&Request{User: "x"}, now, &sc)[1].Key)
	k2 := string(s.Resolve(&Request{APIKey: "x"}, now, &sc)[1].Key)
	if k1 == k2 {
		t.Errorf("user and api key share identity key %q", k1)
	}
}

// TestIndexDoesNotScan files 5,000 rules and checks that resolving one request looks at a
// handful of candidates, not all of them.
func TestIndexDoesNotScan(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "  - {name: ep%d, match: {endpoint: /v1/ep%d}, key: [user], limit: 5, period: 1s}\n", i, i)
		fmt.Fprintf(&b, "  - {name: glob%d, match: {endpoint: \"/v2/ep%d/*\"}, key: [user], limit: 5, period: 1s}\n", i, i)
		fmt.Fprintf(&b, "  - {name: tenant%d, match: {tenant: t%d}, key: [user], limit: 5, period: 1s}\n", i, i)
		fmt.Fprintf(&b, "  - {name: key%d, match: {api_key: k%d, method: GET}, key: [api_key], limit: 5, period: 1s}\n", i, i)
		fmt.Fprintf(&b, "  - {name: ip%d, match: {ip: 10.0.%d.%d}, key: [ip], limit: 5, period: 1s}\n", i, i/256, i%256)
	}
	s := mustCompile(t, b.String())
	req := Request{Endpoint: "/v2/ep7/items", Tenant: "t42", APIKey: "k9", Method: "GET", IP: "10.0.0.5", User: "u"}
	var sc Scratch
	ls := s.Resolve(&req, now, &sc)
	if got := ruleNames(ls); got != "ip5,glob7,key9,tenant42" { // policy order
		t.Errorf("rules %q", got)
	}
	if n := len(sc.cands); n > 8 {
		t.Errorf("%d candidates examined for one request among %d rules", n, len(s.rules))
	}
}

func TestGlob(t *testing.T) {
	t.Parallel()
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"/api/*", "/api/x/y", true},
		{"/api/*", "/api", false},
		{"/api/*", "/api/", true},
		{"*", "", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"bar*b", "barb", true},
		{"bar*b", "barbxb", true},
		{"exact", "exact", true},
		{"exact", "exactly", false},
	}
	for _, c := range cases {
		if got := Glob(c.pattern, c.s); got != c.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// TestPolicyErrors checks that each mistake is reported at its file, line and field.
func TestPolicyErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, yml, want string
	}{
		{"unknown top-level field", "rulez: []\n", "policy.yaml:1: rulez: unknown field"},
		{"misspelled rule field", "rules:\n  - name: a\n    limt: 5\n", "policy.yaml:3: rules[0].limt: unknown field"},
		{"misspelled match field", "rules:\n  - name: a\n    match: {endpont: /x}\n", "policy.yaml:3: rules[0].match.endpont: unknown field"},
		{"wrong type", "rules:\n  - name: a\n    limit: lots\n    period: 1s\n", `policy.yaml:3: rules[0].limit: "lots" is not an integer`},
		{"invalid yaml", "rules: [\n", "policy.yaml:"},
		{"empty file", "", "empty file"},
		{"rules not a list", "rules: {a: 1}\n", "rules: must be a list"},
		{"missing name", "rules:\n  - limit: 1\n    period: 1s\n", "policy.yaml:2: rules[0].name: required"},
		{"zero limit", "rules:\n  - {name: a, limit: 0, period: 1s}\n", "rules[0].limit: must be from 1 to 1099511627776, got 0"},
		{"missing limit", "rules:\n  - {name: a, period: 1s}\n", "rules[0].limit: required: a whole number from 1 to 1099511627776"},
		{"missing period", "rules:\n  - {name: a, limit: 1}\n", "rules[0].period: required"},
		{"bad period", "rules:\n  - {name: a, limit: 1, period: soon}\n", `policy.yaml:2: rules[0].period: invalid duration "soon"`},
		{"bad expiry", "overrides:\n  - {tenant: a, type: ban, expires_at: tomorrow}\n", `policy.yaml:2: overrides[0].expires_at: invalid time`},
		{"list where a map belongs", "rules:\n  - {name: a, limit: 1, period: 1s, match: [x]}\n", "rules[0].match: must be a map"},
		{"bad algorithm", "rules:\n  - {name: a, limit: 1, period: 1s, algorithm: magic}\n", "rules[0].algorithm: unknown algorithm"},
		{"burst on a window", "rules:\n  - {name: a, limit: 1, period: 1s, algorithm: fixed_window, burst: 5}\n", "rules[0].burst"},
		{"soft above hard", "rules:\n  - {name: a, limit: 1, period: 1s, soft: 120}\n", "rules[0].soft"},
		{"bad key attribute", "rules:\n  - {name: a, limit: 1, period: 1s, key: [usr]}\n", `policy.yaml:2: rules[0].key[0]: unknown attribute "usr"`},
		{"duplicate name", "rules:\n  - {name: a, limit: 1, period: 1s}\n  - {name: a, limit: 1, period: 1s}\n", "policy.yaml:3: rules[1].name: duplicate"},
		{"bad store mode", "rules:\n  - {name: a, limit: 1, period: 1s, on_store_error: maybe}\n", "rules[0].on_store_error"},
		{"bad match ip", "rules:\n  - {name: a, limit: 1, period: 1s, match: {ip: 300.1.1.1}}\n", "rules[0].match.ip"},
		{"override without expiry", "rules: []\noverrides:\n  - {tenant: a, type: ban}\n", "policy.yaml:3: overrides[0].expires_at: required"},
		{"override without target", "overrides:\n  - {type: ban, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].tenant"},
		{"override bad type", "overrides:\n  - {tenant: a, type: slow, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].type"},
		{"override bad multiplier", "overrides:\n  - {tenant: a, type: multiplier, value: -1, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].value"},
		{"override unknown rule", "overrides:\n  - {tenant: a, rule: nope, type: ban, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].rule"},
		{"exemption with two fields", "exemptions:\n  - {user: a, tenant: b}\n", "exemptions[0]"},
		{"exemption bad cidr", "exemptions:\n  - {ip: 10.0.0.0/99}\n", "exemptions[0].ip"},
		{"limit too fine to count", "rules:\n  - {name: a, limit: 999999999989, period: 1d, algorithm: gcra}\n", "rules[0].limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := ParseConfig("policy.yaml", []byte(c.yml))
			if err == nil {
				_, err = Compile(cfg)
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to contain %q", err, c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestHardThresholdScalesLimit(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, "rules:\n  - {name: a, limit: 100, period: 1s, hard: 110, soft: 80, algorithm: fixed_window}\n")
	var sc Scratch
	l := s.Resolve(&Request{}, now, &sc)[0]
	if l.Params.Limit != 110 || l.Spec.Limit != 100 || l.Spec.Nominal() != 100 || l.Params.Kind != algorithm.FixedWindow {
		t.Errorf("effective %d nominal %d", l.Params.Limit, l.Spec.Limit)
	}
}

func TestVersionFollowsContent(t *testing.T) {
	t.Parallel()
	a, b := mustCompile(t, designExample), mustCompile(t, designExample)
	c := mustCompile(t, strings.Replace(designExample, "limit: 100\n", "limit: 101\n", 1))
	if a.Version != b.Version || a.Version == c.Version {
		t.Errorf("versions %s %s %s", a.Version, b.Version, c.Version)
	}
}

func TestRequestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		req   Request
		field string
	}{
		{"negative cost", Request{Cost: -1}, "cost"},
		{"huge cost", Request{Cost: MaxCost + 1}, "cost"},
		{"long user", Request{User: strings.Repeat("u", MaxAttribute+1)}, "user"},
		{"bad utf-8", Request{Tenant: "\xff"}, "tenant"},
		{"bad ip", Request{IP: "1.2.3"}, "ip"},
		{"empty descriptor key", Request{Descriptors: map[string]string{"": "x"}}, "descriptors"},
	}
	for _, c := range cases {
		err := c.req.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: error %v, want field %q", c.name, err, c.field)
		}
	}
	if err := (&Request{User: "u", IP: "::1", Cost: 5}).Validate(); err != nil {
		t.Errorf("valid request: %v", err)
	}
}

// FuzzParseConfig feeds arbitrary bytes to the parser and compiler: no panic, and every error
// names where it is.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(designExample))
	f.Add([]byte("rules:\n  - {name: a, limit: 1, period: 1s, tiers: {x: {limit: 2}}}\n"))
	f.Add([]byte("rules: [{name: a, key: [descriptors.x], match: {descriptors: {x: 'a*'}}, limit: 3, period: 1d}]"))
	f.Add([]byte("overrides: [{tenant: a, type: custom, limit: 3, expires_at: 2027-01-01T00:00:00Z}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("f.yaml", data)
		if err == nil {
			var s *Snapshot
			if s, err = Compile(cfg); err == nil {
				var sc Scratch
				s.Resolve(&Request{Endpoint: "/api/x", User: "u", Tenant: "t", Method: "get"}, now, &sc)
				return
			}
		}
		if !strings.HasPrefix(err.Error(), "f.yaml") {
			t.Fatalf("error does not name the file: %q", err)
		}
	})
}

// TestAPIKeysAreHashed: no credential appears in a bucket key, and different keys stay apart.
func TestAPIKeysAreHashed(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, `
rules:
  - {name: k, key: [api_key], limit: 1, period: 1s}
  - {name: i, key: [identity], limit: 1, period: 1s}
`)
	var sc Scratch
	a := s.Resolve(&Request{APIKey: "sk_live_secret_1"}, now, &sc)
	k1, i1 := string(a[0].Key), string(a[1].Key)
	b := s.Resolve(&Request{APIKey: "sk_live_secret_2"}, now, &sc)
	for _, k := range []string{k1, i1} {
		if strings.Contains(k, "secret") {
			t.Errorf("key %q holds the API key", k)
		}
	}
	if k1 == string(b[0].Key) || i1 == string(b[1].Key) {
		t.Error("two API keys share a bucket")
	}
	// The hash is made once per request for the tag and every part: each must be the hash
	// of this request's key, not of the one resolved before in the same Scratch.
	tag, part := key.AppendTag(nil, 'a', "sk_live_secret_2"), key.AppendSecret(nil, "sk_live_secret_2")
	for _, l := range b {
		if k := string(l.Key); !strings.Contains(k, string(tag)) || !strings.HasSuffix(k, string(part)) {
			t.Errorf("key %q: want tag %q and part %q", k, tag, part)
		}
	}
	if got := s.Resolve(&Request{User: "sk_live_secret_1"}, now, &sc)[1].Key; string(got) == i1 {
		t.Error("a user named like an API key shares its identity bucket")
	}
}
