package envoyconf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

func TestUnits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		unit   string
		want   string
		period time.Duration
	}{
		{"second", "second", time.Second},
		{"minute", "minute", time.Minute},
		{"hour", "hour", time.Hour},
		{"day", "day", 24 * time.Hour},
		{"week", "week", 7 * 24 * time.Hour},
		{"month", "month", 30 * 24 * time.Hour},
		{"year", "year", 365 * 24 * time.Hour},
		{"SECOND", "second", time.Second},
		{"Minute", "minute", time.Minute},
		{"dAy", "day", 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.unit, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, map[string]string{"u.yaml": fmt.Sprintf(`
domain: u
descriptors:
  - key: k
    rate_limit: {unit: %s, requests_per_unit: 1000}
`, tt.unit)}, false)
			l := c.Match("u", e("k", "v")).Limit
			if l.Unit != tt.want || l.Period != tt.period {
				t.Fatalf("unit %q, period %s; want %q, %s", l.Unit, l.Period, tt.want, tt.period)
			}
			if l.Params.Kind != algorithm.FixedWindow || l.Params.Limit != 1000 || l.Params.Period != tt.period.Microseconds() {
				t.Fatalf("params = %+v, want fixed_window 1000 per %s", l.Params, tt.period)
			}
		})
	}
}

func TestLimitFields(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"f.yaml": `
domain: fields
descriptors:
  - key: api_key
    value: "a/b=c%"
    shadow_mode: true
    quota_mode: yes
    detailed_metric: on
    value_to_metric: True
    metadata:
      service: svc-1
      weights: [1, 2.5, true, ~, "x"]
      nested: {a: {b: c}}
    rate_limit:
      name: per-key
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 50
      replaces: [{name: global}, {name: other}]
`}, false)
	l := c.Match("fields", e("api_key", "a/b=c%")).Limit
	if l == nil {
		t.Fatal("no limit")
	}
	if l.Name != "per-key" || !l.Shadow || !l.QuotaMode || !l.DetailedMetric || !l.ValueToMetric {
		t.Errorf("flags = %+v", l)
	}
	if l.ID != "api_key=a%2Fb%3Dc%25" {
		t.Errorf("ID = %q, want the value escaped", l.ID)
	}
	if !slices.Equal(l.Replaces, []string{"global", "other"}) {
		t.Errorf("Replaces = %q", l.Replaces)
	}
	if l.Params.Kind != algorithm.TokenBucket || l.Params.Limit != 10 || l.Params.Burst != 50 {
		t.Errorf("Params = %+v, want token_bucket 10/s burst 50", l.Params)
	}
	if l.File != "f.yaml" || l.Line != 14 {
		t.Errorf("source = %s:%d, want f.yaml:14", l.File, l.Line)
	}
	want := fmt.Sprint(map[string]any{
		"service": "svc-1",
		"weights": []any{int64(1), 2.5, true, nil, "x"},
		"nested":  map[string]any{"a": map[string]any{"b": "c"}},
	})
	if got := fmt.Sprint(l.Metadata); got != want {
		t.Errorf("Metadata = %s, want %s", got, want)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"fields"}) {
		t.Errorf("Domains = %q", got)
	}
	if got := c.Limits("fields"); len(got) != 1 || got[0] != l {
		t.Errorf("Limits = %v", got)
	}
}

func TestLimitExtensions(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, map[string]string{"f.yaml": `
domain: ext
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 100
      escalation: {window: 10s, threshold: 50, penalty: 5m}
      adaptive: trust
      regions: global
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window_counter, regions: "home:eu-west", escalation: {window: 1d, threshold: 3, penalty: 2d}}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 5}
`}, false)
	tests := []struct {
		entry         string
		esc           *Escalation
		adaptive      bool
		regions, home string
	}{
		{"user", &Escalation{Window: 10 * time.Second, Threshold: 50, Penalty: 5 * time.Minute}, true, "global", ""},
		{"ip", &Escalation{Window: 24 * time.Hour, Threshold: 3, Penalty: 48 * time.Hour}, false, "home:eu-west", "eu-west"},
		{"plain", nil, false, "", ""},
	}
	for _, tt := range tests {
		l := c.Match("ext", e(tt.entry, "x")).Limit
		if l == nil {
			t.Fatalf("%s: no limit", tt.entry)
		}
		if (l.Escalation == nil) != (tt.esc == nil) {
			t.Fatalf("%s: Escalation = %+v, want %+v", tt.entry, l.Escalation, tt.esc)
		}
		if tt.esc != nil {
			got := *l.Escalation
			if got.Window != tt.esc.Window || got.Threshold != tt.esc.Threshold || got.Penalty != tt.esc.Penalty {
				t.Errorf("%s: Escalation = %+v, want %+v", tt.entry, got, tt.esc)
			}
			if got.Params.Kind != algorithm.FixedWindow || got.Params.Limit != tt.esc.Threshold+1 || got.Params.Period != tt.esc.Window.Microseconds() {
				t.Errorf("%s: burst counter params = %+v, want a fixed window of threshold+1 per window", tt.entry, got.Params)
			}
		}
		if l.Adaptive != tt.adaptive || l.Regions != tt.regions {
			t.Errorf("%s: adaptive %v regions %q, want %v %q", tt.entry, l.Adaptive, l.Regions, tt.adaptive, tt.regions)
		}
		if home, ok := l.HomeRegion(); home != tt.home || ok != (tt.home != "") {
			t.Errorf("%s: HomeRegion = %q %v, want %q", tt.entry, home, ok, tt.home)
		}
	}
}

func TestAcceptedSpellings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, rateLimit string
		rpu             uint32
	}{
		{"hex", "{unit: second, requests_per_unit: 0x10}", 16},
		{"underscores", "{unit: second, requests_per_unit: 1_000}", 1000},
		{"plus sign", "{unit: second, requests_per_unit: +7}", 7},
		{"null requests", "{unit: second, requests_per_unit: ~}", 0},
		{"max uint32", "{unit: second, requests_per_unit: 4294967295}", 4294967295},
		{"unlimited with rpu", "{unlimited: true, requests_per_unit: 5}", 5},
		{"unlimited with null unit", "{unlimited: true, unit: ~}", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, map[string]string{"s.yaml": "domain: s\ndescriptors:\n  - key: k\n    rate_limit: " + tt.rateLimit + "\n"}, false)
			if l := c.Match("s", e("k", "v")).Limit; l == nil || l.RequestsPerUnit != tt.rpu {
				t.Fatalf("limit = %+v, want requests_per_unit %d", l, tt.rpu)
			}
		})
	}
}

func TestNullFields(t *testing.T) {
	t.Parallel()
	// The reference service reads a null as absent: a null rate_limit is no limit at all.
	c := mustLoad(t, map[string]string{"n.yaml": `
domain: n
descriptors:
  - key: k
    value: ~
    rate_limit: ~
    descriptors: ~
    metadata: ~
    shadow_mode: ~
`}, false)
	if l := c.Match("n", e("k", "v")).Limit; l != nil {
		t.Fatalf("limit = %+v, want none", l)
	}
}

// loadErr loads files and returns the first LoadError and the whole message.
func loadErr(t *testing.T, files map[string]string, merge bool) (*LoadError, string) {
	t.Helper()
	m := make(map[string][]byte, len(files))
	for k, v := range files {
		m[k] = []byte(v)
	}
	c, err := Load(m, merge)
	if err == nil {
		t.Fatalf("Load succeeded with domains %q, want an error", c.Domains())
	}
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("error %v is not a *LoadError", err)
	}
	return le, err.Error()
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	const head = "domain: d\ndescriptors:\n"
	one := func(s string) map[string]string { return map[string]string{"bad.yaml": s} }
	tests := []struct {
		name  string
		files map[string]string
		merge bool
		file  string
		line  int
		field string
		msg   string
	}{
		{"invalid yaml", one("domain: d\ndescriptors: [\n"), false, "bad.yaml", 2, "yaml", "did not find expected node content"},
		{"invalid yaml mapping", one("domain: d\n  x: y\n"), false, "bad.yaml", 2, "yaml", "mapping values are not allowed"},
		{"empty file", one(""), false, "bad.yaml", 1, "domain", "file is empty"},
		{"comments only", one("# nothing\n"), false, "bad.yaml", 1, "domain", "file is empty"},
		{"top level list", one("- domain: d\n"), false, "bad.yaml", 1, "document", "must be a mapping"},
		{"two documents", one("domain: a\n---\ndomain: b\n"), false, "bad.yaml", 2, "document", "second YAML document"},
		{"missing domain", one("descriptors: []\n"), false, "bad.yaml", 1, "domain", "must not be empty"},
		{"empty domain", one("domain: \"\"\ndescriptors: []\n"), false, "bad.yaml", 1, "domain", "must not be empty"},
		{"domain not a string", one("domain: [a]\n"), false, "bad.yaml", 1, "domain", "must be a string"},
		{"unknown top-level field", one("domain: d\ndescriptor: []\n"), false, "bad.yaml", 2, "descriptor", `did you mean "descriptors"`},
		{"duplicate field", one("domain: d\ndomain: e\n"), false, "bad.yaml", 2, "domain", "duplicate field (first at line 1)"},
		{"misspelled rate_limit", one(head + "  - key: k\n    ratelimit: {unit: second}\n"), false, "bad.yaml", 4, "descriptors[0].ratelimit", `did you mean "rate_limit"`},
		{"misspelled requests_per_unit", one(head + "  - key: k\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n"), false, "bad.yaml", 6, "descriptors[0].rate_limit.requestsperunit", "unknown field"},
		{"field from another level", one(head + "  - key: k\n    domain: x\n"), false, "bad.yaml", 4, "descriptors[0].domain", "unknown field"},
		{"unknown field deep", one(head + "  - key: a\n    descriptors:\n      - key: b\n        shadow: true\n"), false, "bad.yaml", 6, "descriptors[0].descriptors[0].shadow", "unknown field"},
		{"unknown field in replaces", one(head + "  - key: k\n    rate_limit: {unit: second, replaces: [{nam: x}]}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.replaces[0].nam", "unknown field"},
		{"merge key", one("base: &b {key: k}\n"), false, "bad.yaml", 1, "base", "unknown field"},
		{"yaml merge key", one(head + "  - &a {key: k}\n  - <<: *a\n    value: v\n"), false, "bad.yaml", 4, "descriptors[1].<<", "merge keys are not supported"},
		{"non-map list entry", one(head + "  - a\n"), false, "bad.yaml", 3, "descriptors[0]", "must be a mapping"},
		{"descriptors not a list", one("domain: d\ndescriptors: {key: k}\n"), false, "bad.yaml", 2, "descriptors", "must be a list"},
		{"non-map replaces entry", one(head + "  - key: k\n    rate_limit: {unit: second, replaces: [x]}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.replaces[0]", "must be a mapping"},
		{"replaces not a list", one(head + "  - key: k\n    rate_limit: {unit: second, replaces: {name: x}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.replaces", "must be a list"},
		{"empty key", one(head + "  - key: \"\"\n"), false, "bad.yaml", 3, "descriptors[0].key", "must not be empty"},
		{"missing key", one(head + "  - value: v\n"), false, "bad.yaml", 3, "descriptors[0].key", "must not be empty"},
		{"duplicate descriptor", one(head + "  - key: k\n    value: v\n  - key: k\n    value: v\n"), false, "bad.yaml", 5, "descriptors[1]", `duplicate descriptor key "k" value "v" (first at line 3)`},
		{"duplicate default", one(head + "  - key: k\n  - key: k\n    value: \"\"\n"), false, "bad.yaml", 4, "descriptors[1]", `duplicate descriptor key "k" (no value)`},
		{"duplicate nested", one(head + "  - key: a\n    descriptors:\n      - key: b\n      - key: b\n"), false, "bad.yaml", 6, "descriptors[0].descriptors[1]", "duplicate descriptor"},
		{"bad unit", one(head + "  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.unit", `invalid unit "fortnight"`},
		{"unknown unit", one(head + "  - key: k\n    rate_limit: {unit: unknown}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.unit", "invalid unit"},
		{"missing unit", one(head + "  - key: k\n    rate_limit: {requests_per_unit: 1}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.unit", "missing"},
		{"empty rate_limit", one(head + "  - key: k\n    rate_limit: {}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.unit", "missing"},
		{"rate_limit not a mapping", one(head + "  - key: k\n    rate_limit: 5/s\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit", "must be a mapping"},
		{"unit with unlimited", one(head + "  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n"), false, "bad.yaml", 6, "descriptors[0].rate_limit.unit", "must not be set when unlimited is true"},
		{"algorithm with unlimited", one(head + "  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.algorithm", "must not be set when unlimited"},
		{"replaces itself", one(head + "  - key: k\n    rate_limit:\n      unit: second\n      name: me\n      replaces:\n        - name: me\n"), false, "bad.yaml", 8, "descriptors[0].rate_limit.replaces[0].name", "cannot replace itself"},
		{"replaces empty name", one(head + "  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n"), false, "bad.yaml", 7, "descriptors[0].rate_limit.replaces[0].name", "must not be empty"},
		{"replaces entry without name", one(head + "  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - {}\n"), false, "bad.yaml", 7, "descriptors[0].rate_limit.replaces[0].name", "must not be empty"},
		{"negative requests", one(head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", "must not be negative"},
		{"quoted requests", one(head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"10\"}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", `must be a whole number, got the string "10"`},
		{"float requests", one(head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", "must be a whole number"},
		{"requests above uint32", one(head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", "must be at most 4294967295"},
		{"bool not a bool", one(head + "  - key: k\n    shadow_mode: sometimes\n"), false, "bad.yaml", 4, "descriptors[0].shadow_mode", "must be true or false"},
		{"quoted bool", one(head + "  - key: k\n    shadow_mode: \"true\"\n"), false, "bad.yaml", 4, "descriptors[0].shadow_mode", `got the string "true"`},
		{"value not a string", one(head + "  - key: k\n    value: [a, b]\n"), false, "bad.yaml", 4, "descriptors[0].value", "must be a string"},
		{"metadata not a mapping", one(head + "  - key: k\n    metadata: [a]\n"), false, "bad.yaml", 4, "descriptors[0].metadata", "must be a mapping"},
		{"share_threshold without wildcard", one(head + "  - key: k\n    value: v\n    share_threshold: true\n"), false, "bad.yaml", 5, "descriptors[0].share_threshold", "needs a wildcard value"},
		{"unknown algorithm", one(head + "  - key: k\n    rate_limit: {unit: second, algorithm: magic}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.algorithm", "unknown algorithm"},
		{"burst on a window", one(head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.burst", "only token_bucket, gcra and leaky_bucket"},
		{"burst zero", one(head + "  - key: k\n    rate_limit: {unit: second, algorithm: gcra, burst: 0}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.burst", "at least 1"},
		{"too fine to count", one(head + "  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967291, algorithm: token_bucket}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit", "too fine"},
		{"escalation not a mapping", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: 5}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation", "must be a mapping"},
		{"escalation unknown field", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {window: 10s, threshold: 5, penalty: 1m, ban: 1h}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.ban", "unknown field"},
		{"escalation without window", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {threshold: 5, penalty: 1m}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.window", "required"},
		{"escalation bad window", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {window: soon, threshold: 5, penalty: 1m}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.window", "must be a duration"},
		{"escalation window too short", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {window: 1us, threshold: 5, penalty: 1m}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.window", "must be from 1ms"},
		{"escalation threshold zero", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {window: 10s, threshold: 0, penalty: 1m}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.threshold", "must be from 1"},
		{"escalation without penalty", one(head + "  - key: k\n    rate_limit: {unit: second, escalation: {window: 10s, threshold: 5}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation.penalty", "must be from 1s"},
		{"escalation with unlimited", one(head + "  - key: k\n    rate_limit: {unlimited: true, escalation: {window: 10s, threshold: 5, penalty: 1m}}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.escalation", "must not be set when unlimited"},
		{"adaptive not trust", one(head + "  - key: k\n    rate_limit: {unit: second, adaptive: load}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.adaptive", `"load" is not trust`},
		{"adaptive with unlimited", one(head + "  - key: k\n    rate_limit: {unlimited: true, adaptive: trust}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.adaptive", "must not be set when unlimited"},
		{"regions unknown", one(head + "  - key: k\n    rate_limit: {unit: second, regions: everywhere}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.regions", "is not global or home:NAME"},
		{"regions global on a bucket", one(head + "  - key: k\n    rate_limit: {unit: second, algorithm: gcra, regions: global}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.regions", "needs a window algorithm"},
		{"regions bad home", one(head + "  - key: k\n    rate_limit: {unit: second, regions: \"home:eu west\"}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.regions", "home:NAME"},
		{"regions with unlimited", one(head + "  - key: k\n    rate_limit: {unlimited: true, regions: global}\n"), false, "bad.yaml", 4, "descriptors[0].rate_limit.regions", "must not be set when unlimited"},
		{"domain in two files", map[string]string{"a.yaml": "domain: d\n", "b.yaml": "# b\ndomain: d\n"}, false, "b.yaml", 2, "domain", `domain "d" is already defined in a.yaml:1`},
		{"merge conflict", map[string]string{"a.yaml": head + "  - key: k\n", "b.yaml": head + "  - key: x\n  - key: k\n"}, true, "b.yaml", 4, "descriptors", `descriptor key "k" (no value) is already defined in a.yaml:3`},
		{"merge conflict with nested children", map[string]string{"a.yaml": head + "  - key: k\n    value: v\n    descriptors: [{key: a}]\n", "b.yaml": head + "  - key: k\n    value: v\n    descriptors: [{key: b}]\n"}, true, "b.yaml", 3, "descriptors", "already defined in a.yaml:3"},
		{"alias bomb", one(aliasBomb), false, "bad.yaml", 1, "document", "aliases expand"},
		{"recursive alias in descriptors", one("domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n"), false, "bad.yaml", 2,
			strings.Repeat("descriptors[0].", maxDepth) + "descriptors", "a recursive alias?"},
		{"recursive alias in metadata", one(head + "  - key: k\n    metadata: &m {a: *m}\n"), false, "bad.yaml", 4,
			"descriptors[0].metadata" + strings.Repeat(".a", maxDepth-1), "a recursive alias?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			le, all := loadErr(t, tt.files, tt.merge)
			if le.File != tt.file || le.Line != tt.line || le.Field != tt.field || !strings.Contains(le.Msg, tt.msg) {
				t.Fatalf("error %q\nwant %s:%d: %s: ...%s...", all, tt.file, tt.line, tt.field, tt.msg)
			}
			if prefix := fmt.Sprintf("%s:%d: %s: ", tt.file, tt.line, tt.field); !strings.HasPrefix(le.Error(), prefix) {
				t.Fatalf("Error() = %q, want prefix %q", le.Error(), prefix)
			}
		})
	}
}

// aliasBomb expands to 10^9 nodes if followed naively.
const aliasBomb = `domain: d
descriptors:
  - key: k
    metadata:
      a: &a ["x","x","x","x","x","x","x","x","x","x"]
      b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
      c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
      d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
      e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
      f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
      bomb: [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
`

func TestLoadReportsEveryError(t *testing.T) {
	t.Parallel()
	_, all := loadErr(t, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    ratelimit: 1\n  - key: \"\"\n",
		"b.yaml": "domain: b\ndescriptors: [x]\n",
	}, false)
	for _, want := range []string{"a.yaml:4: descriptors[0].ratelimit:", "a.yaml:5: descriptors[1].key:", "b.yaml:2: descriptors[0]:"} {
		if !strings.Contains(all, want) {
			t.Errorf("error %q does not contain %q", all, want)
		}
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		"1-base.yaml": `
domain: shared
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 1}
`,
		"2-extra.yaml": `
domain: shared
descriptors:
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /a*
    rate_limit: {unit: minute, requests_per_unit: 2}
`,
		"3-other.yaml": "domain: other\ndescriptors: []\n",
	}

	t.Run("merged", func(t *testing.T) {
		t.Parallel()
		c := mustLoad(t, files, true)
		if got := c.Domains(); !slices.Equal(got, []string{"other", "shared"}) {
			t.Fatalf("Domains = %q", got)
		}
		for _, tt := range []struct {
			entries []Entry
			rpu     uint32
			file    string
		}{
			{e("key1", "value1"), 10, "1-base.yaml"},
			{e("key2", "value2"), 20, "2-extra.yaml"},
			{e("path", "/api/x"), 1, "1-base.yaml"}, // the earlier file's wildcard is tried first
			{e("path", "/abc"), 2, "2-extra.yaml"},
		} {
			l := c.Match("shared", tt.entries).Limit
			if l == nil || l.RequestsPerUnit != tt.rpu || l.File != tt.file {
				t.Errorf("Match(%v) = %+v, want %d from %s", tt.entries, l, tt.rpu, tt.file)
			}
		}
		if got := len(c.Limits("shared")); got != 4 {
			t.Errorf("Limits = %d, want 4", got)
		}
	})

	t.Run("not merged", func(t *testing.T) {
		t.Parallel()
		le, _ := loadErr(t, files, false)
		if le.File != "2-extra.yaml" || !strings.Contains(le.Msg, "1-base.yaml") {
			t.Fatalf("error %v, want one naming both files", le)
		}
	})
}

func TestLoadDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.YML", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	write("notes.txt", "not yaml: [")
	write(".hidden.yaml", "not yaml: [")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub.yaml", "c.yaml"), []byte("domain: c\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	c, err := LoadDir(dir, false)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Domains = %q, want [a b]", got)
	}
	if l := c.Match("b", e("k", "v")).Limit; l == nil || l.RequestsPerUnit != 2 || l.File != filepath.Join(dir, "b.YML") {
		t.Fatalf("limit = %+v", l)
	}

	write("z.yaml", "domain: a\n")
	_, err = LoadDir(dir, false)
	var le *LoadError
	if !errors.As(err, &le) || le.File != filepath.Join(dir, "z.yaml") || !strings.Contains(le.Msg, filepath.Join(dir, "a.yaml")) {
		t.Fatalf("LoadDir error = %v, want a duplicate domain naming both paths", err)
	}

	if _, err := LoadDir(filepath.Join(dir, "missing"), false); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadDir(missing) = %v, want ErrNotExist", err)
	}
}

func TestLoadNothing(t *testing.T) {
	t.Parallel()
	c, err := Load(nil, false)
	if err != nil || len(c.Domains()) != 0 || c.Match("d", e("k", "v")).Limit != nil || c.Limits("d") != nil {
		t.Fatalf("Load(nil) = %v, %v; want an empty config", c, err)
	}
}
