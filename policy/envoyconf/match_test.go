package envoyconf

import (
	"slices"
	"testing"
)

// matchConfig follows the reference service's basic_config.yaml and wildcard.yaml, plus the
// cases its README describes in prose.
const matchConfig = `
domain: test
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}

  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: val*
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: key2
    value: v*
    rate_limit: {unit: minute, requests_per_unit: 50}

  - key: mid
    value: bar*b
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: multi
    value: a*b*c
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: any
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 3}

  - key: whitelist
    value: ok
  - key: whitelist
    rate_limit: {unit: day, requests_per_unit: 4}

  - key: parent
    rate_limit: {unit: hour, requests_per_unit: 6}
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 7}

  - key: num
    value: 10
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: novalue
    value: ""
    rate_limit: {unit: second, requests_per_unit: 9}

  - key: leaf
    value: x
    rate_limit: {unit: second, requests_per_unit: 11}
  - key: leaf
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 12}

  - key: open
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second}
`

func mustLoad(t testing.TB, files map[string]string, merge bool) *Config {
	t.Helper()
	m := make(map[string][]byte, len(files))
	for k, v := range files {
		m[k] = []byte(v)
	}
	c, err := Load(m, merge)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func e(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

func TestMatch(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"test.yaml": matchConfig}, false)
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		wantID  string // "" means no limit applies
		wantRPU uint32
	}{
		{"exact value beats default", "test", e("key2", "value2"), "key2=value2", 30},
		{"default key takes other values", "test", e("key2", "other"), "key2", 20},
		{"wildcard beats default", "test", e("key2", "value9"), "key2=val*", 40},
		{"exact beats wildcard", "test", e("key2", "value2"), "key2=value2", 30},
		{"first listed wildcard wins", "test", e("key2", "valx"), "key2=val*", 40},
		{"second wildcard when first misses", "test", e("key2", "vx"), "key2=v*", 50},
		{"wildcard matches the bare prefix", "test", e("key2", "val"), "key2=val*", 40},
		{"empty request value skips exact and prefix wildcards", "test", e("key2", ""), "key2", 20},
		{"literal star value reaches the wildcard node", "test", e("key2", "val*"), "key2=val*", 40},

		{"middle wildcard", "test", e("mid", "barxyzb"), "mid=bar*b", 1},
		{"middle wildcard matches nothing between", "test", e("mid", "barb"), "mid=bar*b", 1},
		{"middle wildcard needs the suffix", "test", e("mid", "barbx"), "", 0},
		{"middle wildcard prefix and suffix cannot overlap", "test", e("mid", "bar"), "", 0},
		{"two wildcards", "test", e("multi", "aXbYc"), "multi=a*b*c", 2},
		{"two wildcards, empty runs", "test", e("multi", "abc"), "multi=a*b*c", 2},
		{"two wildcards out of order", "test", e("multi", "acb"), "", 0},
		{"two wildcards missing middle", "test", e("multi", "ac"), "", 0},
		{"star matches anything", "test", e("any", "whatever"), "any=*", 3},
		{"star matches the empty value", "test", e("any", ""), "any=*", 3},

		{"nested default", "test", e("key1", "value1", "subkey1", "something"), "key1=value1/subkey1", 5},
		{"nested exact", "test", e("key1", "value1", "subkey1", "subvalue1"), "key1=value1/subkey1=subvalue1", 10},
		{"placeholder node has no limit", "test", e("key1", "value1"), "", 0},
		{"unmatched top level", "test", e("key1", "something"), "", 0},
		{"unknown key", "test", e("nope", "x"), "", 0},
		{"every entry must match", "test", e("key2", "value2", "extra", "x"), "", 0},
		{"unmatched nested entry", "test", e("key1", "value1", "other", "x"), "", 0},

		{"whitelist node without rate_limit", "test", e("whitelist", "ok"), "", 0},
		{"whitelist default still limits others", "test", e("whitelist", "other"), "whitelist", 4},

		{"limit on the last node", "test", e("parent", "p"), "parent", 6},
		{"deeper limit when more entries", "test", e("parent", "p", "child", "c"), "parent/child", 7},
		{"intermediate limit does not apply", "test", e("parent", "p", "other", "c"), "", 0},

		{"number value is its text", "test", e("num", "10"), "num=10", 8},
		{"number value is not reformatted", "test", e("num", "10.0"), "", 0},
		{`value "" is no value`, "test", e("novalue", "anything"), "novalue", 9},
		{`value "" also matches an empty value`, "test", e("novalue", ""), "novalue", 9},

		{"no backtracking after an exact leaf", "test", e("leaf", "x", "sub", "y"), "", 0},
		{"default used when exact misses", "test", e("leaf", "y", "sub", "y"), "leaf/sub", 12},

		{"unlimited", "test", e("open", "x"), "open", 0},
		{"requests_per_unit missing is 0", "test", e("zero", "x"), "zero", 0},

		{"unknown domain", "nope", e("key2", "value2"), "", 0},
		{"empty domain", "", e("key2", "value2"), "", 0},
		{"no entries", "test", nil, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := c.Match(tt.domain, tt.entries)
			if tt.wantID == "" {
				if m.Limit != nil {
					t.Fatalf("Match = %q, want no limit", m.Limit.ID)
				}
				return
			}
			if m.Limit == nil {
				t.Fatalf("Match = no limit, want %q", tt.wantID)
			}
			if m.Limit.ID != tt.wantID || m.Limit.RequestsPerUnit != tt.wantRPU || m.Limit.Domain != tt.domain {
				t.Fatalf("Match = %s/%q rpu %d, want %s/%q rpu %d",
					m.Limit.Domain, m.Limit.ID, m.Limit.RequestsPerUnit, tt.domain, tt.wantID, tt.wantRPU)
			}
		})
	}
}

func TestMatchUnlimitedAndZero(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"test.yaml": matchConfig}, false)

	open := c.Match("test", e("open", "x")).Limit
	if !open.Unlimited || open.Unit != "" || open.Period != 0 || open.Params.Kind != 0 {
		t.Errorf("unlimited limit = %+v, want Unlimited with no unit, period or params", open)
	}

	zero := c.Match("test", e("zero", "x")).Limit
	if zero.Unlimited || zero.RequestsPerUnit != 0 || zero.Params.Limit != 0 || zero.Params.Period != 1_000_000 {
		t.Errorf("zero limit = %+v, want a limit of 0 per second", zero)
	}
}

func TestCounterValues(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"share.yaml": `
domain: share
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: models
    value: m*-v*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: perval
    value: p*
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 10}
`}, false)

	type kv = [2]string
	tests := []struct {
		name    string
		entries []Entry
		want    []kv
	}{
		{"shared wildcard uses the pattern", e("files", "files/a.pdf"), []kv{{"files", "files/*"}}},
		{"another value shares the same counter", e("files", "files/b.csv"), []kv{{"files", "files/*"}}},
		{"literal pattern value is the same counter", e("files", "files/*"), []kv{{"files", "files/*"}}},
		{"shared middle wildcard", e("models", "mistral-v2"), []kv{{"models", "m*-v*"}}},
		{"wildcard without share_threshold counts per value", e("perval", "p1"), []kv{{"perval", "p1"}}},
		{"shared level above the limit", e("route", "api/x", "user", "bob"), []kv{{"route", "api/*"}, {"user", "bob"}}},
		{"default node counts per value", e("plain", "a"), []kv{{"plain", "a"}}},
		{"no limit keeps the request's values", e("none", "a"), []kv{{"none", "a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []kv
			c.Match("share", tt.entries).CounterValues(tt.entries, func(k, v string) { got = append(got, kv{k, v}) })
			if !slices.Equal(got, tt.want) {
				t.Fatalf("CounterValues = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReplaced(t *testing.T) {
	t.Parallel()
	lim := func(name string, replaces ...string) *Limit { return &Limit{Name: name, Replaces: replaces} }
	a := lim("a", "b")
	b := lim("b", "c")
	c := lim("c")
	anon := lim("", "a")
	open := &Limit{Name: "open", Unlimited: true, Replaces: []string{"c"}}
	m1, m2 := lim("m1", "m2"), lim("m2", "m1")
	tests := []struct {
		name   string
		limits []*Limit
		want   []bool
	}{
		{"nothing", nil, []bool{}},
		{"no replaces", []*Limit{c, nil}, []bool{false, false}},
		{"replacer drops the replaced", []*Limit{b, c}, []bool{false, true}},
		{"order does not matter", []*Limit{c, b}, []bool{true, false}},
		{"replaced alone stays", []*Limit{c}, []bool{false}},
		{"chain drops every replaced link", []*Limit{a, b, c}, []bool{false, true, true}},
		{"unnamed limit replaces but is never replaced", []*Limit{anon, a}, []bool{false, true}},
		{"mutual replacement drops both", []*Limit{m1, m2}, []bool{true, true}},
		{"unlimited replaces others", []*Limit{open, c}, []bool{false, true}},
		{"unlimited is never reported replaced", []*Limit{lim("x", "open"), open}, []bool{false, false}},
		{"nil entries are skipped", []*Limit{nil, b, nil, c}, []bool{false, false, false, true}},
		{"same limit matched twice", []*Limit{c, c, b}, []bool{true, true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Replaced(tt.limits); !slices.Equal(got, tt.want) {
				t.Fatalf("Replaced = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReplacesFromFile(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"r.yaml": `
domain: r
descriptors:
  - key: category
    value: read
    rate_limit: {unit: minute, requests_per_unit: 100, name: read}
  - key: endpoint
    value: /special
    rate_limit:
      unit: minute
      requests_per_unit: 500
      replaces:
        - name: read
`}, false)
	read := c.Match("r", e("category", "read")).Limit
	special := c.Match("r", e("endpoint", "/special")).Limit
	if got := Replaced([]*Limit{read, special}); !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("Replaced = %v, want [true false]", got)
	}
	if !slices.Equal(special.Replaces, []string{"read"}) || read.Name != "read" {
		t.Fatalf("names = %q replaces %q", read.Name, special.Replaces)
	}
}

func TestGlobMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"foo*", "foo", true},
		{"foo*", "foobar", true},
		{"foo*", "fo", false},
		{"*foo", "barfoo", true},
		{"*foo", "foobar", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a**b", "ab", true},
		{"*a*", "bab", true},
		{"*a*", "bbb", false},
		{"a*b*c", "abbc", true},
		{"a*b*c", "acbc", true},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
	}
	for _, tt := range tests {
		if got := globMatch(splitGlob(tt.pattern), tt.value); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

func splitGlob(p string) []string {
	var parts []string
	start := 0
	for i := 0; i < len(p); i++ {
		if p[i] == '*' {
			parts = append(parts, p[start:i])
			start = i + 1
		}
	}
	return append(parts, p[start:])
}

func TestMatchAllocatesNothing(t *testing.T) {
	c := mustLoad(t, map[string]string{"test.yaml": matchConfig}, false)
	entries := e("key1", "value1", "subkey1", "subvalue1")
	allocs := testing.AllocsPerRun(100, func() {
		m := c.Match("test", entries)
		m.CounterValues(entries, func(string, string) {})
	})
	if allocs != 0 {
		t.Fatalf("Match allocates %v times, want 0", allocs)
	}
}

func BenchmarkMatch(b *testing.B) {
	c := mustLoad(b, map[string]string{"test.yaml": matchConfig}, false)
	entries := e("key1", "value1", "subkey1", "subvalue1")
	wild := e("multi", "aXXXbYYYc")
	b.ReportAllocs()
	for b.Loop() {
		c.Match("test", entries)
		c.Match("test", wild)
	}
}
