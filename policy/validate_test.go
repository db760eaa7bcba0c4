package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNumericBounds gives each numeric field a value past its bound, and checks the error
// names that field, on its line: nothing is accepted and then ignored, wrapped or overflowed.
func TestNumericBounds(t *testing.T) {
	t.Parallel()
	const rule = "rules:\n  - name: a\n    algorithm: token_bucket\n    period: 1s\n"
	cases := []struct {
		name, yml, want string
	}{
		{"burst at the int64 maximum", rule + "    limit: 10\n    burst: 9223372036854775807\n", "policy.yaml:6: rules[0].burst: must be from 1 to 1099511627776"},
		{"burst past the int64 range", rule + "    limit: 10\n    burst: 9223372036854775808\n", "policy.yaml:6: rules[0].burst: 9223372036854775808 is past the integer range"},
		{"negative limit past the int64 range", rule + "    limit: -9223372036854775809\n", "policy.yaml:5: rules[0].limit: -9223372036854775809 is past the integer range"},
		{"limit past the maximum", rule + "    limit: 1099511627777\n", "policy.yaml:5: rules[0].limit: must be from 1 to 1099511627776"},
		{"limit times hard past the maximum", rule + "    limit: 1099511627776\n    hard: 110\n", "policy.yaml:5: rules[0].limit: 1099511627776 at hard 110% is"},
		{"burst times hard past the maximum", rule + "    limit: 10\n    burst: 1099511627776\n    hard: 200\n", "policy.yaml:6: rules[0].burst: 1099511627776 at hard 200% is"},
		{"explicit burst 0", rule + "    limit: 10\n    burst: 0\n", "policy.yaml:6: rules[0].burst: must be from 1"},
		{"negative burst", rule + "    limit: 10\n    burst: -5\n", "policy.yaml:6: rules[0].burst: must be from 1"},
		{"period of 1ns names the period", rule[:len(rule)-len("    period: 1s\n")] + "    limit: 10\n    period: 1ns\n", "policy.yaml:5: rules[0].period: must be from 1ms to 400d"},
		{"period past 400 days", "rules:\n  - {name: a, limit: 1, period: 9601h}\n", "rules[0].period: must be from 1ms"},
		{"negative period", "rules:\n  - {name: a, limit: 1, period: -1s}\n", "rules[0].period: must be from 1ms"},
		{"period not whole microseconds", "rules:\n  - {name: a, limit: 1, period: 1500ns}\n", "rules[0].period: must be from 1ms"},
		{"fractional microseconds", "rules:\n  - {name: a, limit: 1, period: 1000500ns}\n", "rules[0].period: must be a whole number of microseconds"},
		{"hard 0", rule + "    limit: 10\n    hard: 0\n", "policy.yaml:6: rules[0].hard: must be a percentage from 1 to 1000, got 0"},
		{"hard past 1000", rule + "    limit: 10\n    hard: 1001\n", "policy.yaml:6: rules[0].hard: must be a percentage from 1 to 1000"},
		{"soft 0", rule + "    limit: 10\n    soft: 0\n", "policy.yaml:6: rules[0].soft: must be a percentage from 1 to 99"},
		{"soft at hard", rule + "    limit: 10\n    soft: 100\n", "policy.yaml:6: rules[0].soft: must be a percentage from 1 to 99 (below hard, 100), got 100"},
		{"tier limit 0", rule + "    limit: 10\n    tiers:\n      free:\n        limit: 0\n", "policy.yaml:8: rules[0].tiers.free.limit: must be from 1"},
		{"tier burst 0", rule + "    limit: 10\n    tiers:\n      free:\n        burst: 0\n", "policy.yaml:8: rules[0].tiers.free.burst: must be from 1"},
		{"tier limit past int64", rule + "    limit: 10\n    tiers: {free: {limit: 99999999999999999999}}\n", "policy.yaml:6: rules[0].tiers.free.limit: 99999999999999999999 is past the integer range"},
		{"tier limit past the maximum", rule + "    limit: 10\n    tiers: {free: {limit: 9223372036854775807}}\n", "rules[0].tiers.free.limit: must be from 1 to 1099511627776"},
		{"tier period 1ns", rule + "    limit: 10\n    tiers:\n      free:\n        period: 1ns\n", "policy.yaml:8: rules[0].tiers.free.period: must be from 1ms"},
		{"tier setting nothing", rule + "    limit: 10\n    tiers:\n      free: {}\n", "policy.yaml:7: rules[0].tiers.free: sets none of limit, burst and period"},
		{"tier burst on a window", "rules:\n  - {name: a, limit: 1, period: 1s, algorithm: fixed_window, tiers: {free: {burst: 5}}}\n", "rules[0].tiers.free.burst: applies only to"},
		{"custom override limit past the maximum", "overrides:\n  - {tenant: a, type: custom, limit: 9223372036854775807, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].limit: must be from 1 to 1099511627776"},
		{"custom override negative burst", "overrides:\n  - {tenant: a, type: custom, limit: 5, burst: -1, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].burst: must be from 1"},
		{"custom override value past int64", "overrides:\n  - {tenant: a, type: custom, value: 1e300, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].value: a custom limit must be a whole number from 1 to"},
		{"custom override fractional value", "overrides:\n  - {tenant: a, type: custom, value: 2.5, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].value: a custom limit must be a whole number"},
		{"multiplier infinite", "overrides:\n  - {tenant: a, type: multiplier, value: .inf, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].value: a multiplier must be above 0 and at most 1000"},
		{"multiplier not a number", "overrides:\n  - {tenant: a, type: multiplier, value: .nan, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].value: a multiplier must be above 0"},
		{"ban with a limit", "overrides:\n  - {tenant: a, type: ban, limit: 5, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].limit: does not apply to a ban override"},
		{"multiplier with a burst", "overrides:\n  - {tenant: a, type: multiplier, value: 2, burst: 5, expires_at: 2027-01-01T00:00:00Z}\n", "overrides[0].burst: does not apply to a multiplier override"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadFiles(map[string][]byte{"policy.yaml": []byte(c.yml)})
			if err == nil {
				t.Fatalf("accepted; want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not wrap ErrInvalid", err)
			}
		})
	}
}

// TestEveryErrorOnItsLine: a file with several mistakes reports each, once, as
// file:line: field: message on the line of the field itself, in line order.
func TestEveryErrorOnItsLine(t *testing.T) {
	t.Parallel()
	yml := `rules:
  - name: a
    algorithm: token_bucket
    limit: 0
    period: 1ns
    burst: 9223372036854775807
    tiers:
      free:
        limit: 0
  - name: b
    limt: 5
    period: soon
    key: [tenant, usr]
    on_store_error: maybe
  - name: a
    limit: 1
    period: 1s
overrides:
  - tenant: acme
    type: custom
    value: 1e300
exemptions:
  - {user: x, tenant: y}
`
	_, err := LoadFiles(map[string][]byte{"p.yaml": []byte(yml)})
	if err == nil {
		t.Fatal("accepted")
	}
	want := []string{
		"p.yaml:4: rules[0].limit: must be from 1 to 1099511627776, got 0", // written: out of range, not missing
		"p.yaml:5: rules[0].period: must be from 1ms",
		"p.yaml:6: rules[0].burst: must be from 1 to 1099511627776",
		"p.yaml:9: rules[0].tiers.free.limit: must be from 1",
		"p.yaml:10: rules[1].limit: required", // limt is misspelled: the limit is missing
		"p.yaml:11: rules[1].limt: unknown field",
		"p.yaml:12: rules[1].period: invalid duration",
		"p.yaml:13: rules[1].key[1]: unknown attribute",
		"p.yaml:14: rules[1].on_store_error:",
		"p.yaml:15: rules[2].name: duplicate rule name",
		"p.yaml:19: overrides[0].expires_at: required",
		"p.yaml:21: overrides[0].value: a custom limit must be a whole number",
		"p.yaml:23: exemptions[0]",
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(lines), len(want), err)
	}
	for i := range min(len(lines), len(want)) {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("error %d: %q\n           want %q...", i, lines[i], want[i])
		}
	}
	var fe *FieldError
	if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) {
		t.Errorf("errors are not *FieldError wrapping ErrInvalid: %T", err)
	}
}

// TestVersionIgnoresPathSpelling: the version depends on the files' contents only, so that the
// same policy read as ./p.yaml, p.yaml, an absolute path or a folder, on any node, compares
// equal; a change of content changes it.
func TestVersionIgnoresPathSpelling(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(designExample), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	versions := map[string]string{}
	for _, path := range []string{"p.yaml", "./p.yaml", filepath.Join(dir, "p.yaml"), ".", dir, dir + "/"} {
		s, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		versions[path] = s.Version
	}
	s, err := LoadFiles(map[string][]byte{"/etc/sluice/elsewhere.yaml": []byte(designExample)})
	if err != nil {
		t.Fatal(err)
	}
	versions["in memory, another name"] = s.Version
	for path, v := range versions {
		if v != versions["p.yaml"] {
			t.Errorf("version %s from %q, %s from %q", v, path, versions["p.yaml"], "p.yaml")
		}
	}
	changed, err := LoadFiles(map[string][]byte{"p.yaml": []byte(designExample + "\n# edited\n")})
	if err != nil {
		t.Fatal(err)
	}
	if changed.Version == versions["p.yaml"] {
		t.Error("a change of content kept the version")
	}
}

// TestAliasExpansionRefused: aliases repeated at two levels (3,000 rules sharing a map of
// 3,000 tiers) would have the checker visit 9 million nodes; it refuses the file instead.
func TestAliasExpansionRefused(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("tiers: &t {")
	for i := range 3000 {
		fmt.Fprintf(&b, "t%d: {limit: 1}, ", i)
	}
	b.WriteString("}\nrule: &r {name: a, limit: 1, period: 1s, tiers: *t}\nrules: [")
	b.WriteString(strings.Repeat("*r, ", 3000))
	b.WriteString("]\n")
	_, err := LoadFiles(map[string][]byte{"bomb.yaml": []byte(b.String())})
	if err == nil || !strings.Contains(err.Error(), "aliases expand to too many YAML nodes") {
		t.Fatalf("error %v, want the aliases refused", err)
	}
}

func TestDurationWrittenAsPeopleWriteIt(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"1d": "1d", "24h": "1d", "90m": "90m", "1h": "1h", "60s": "1m", "1500ms": "1500ms", "100ms": "100ms", "1s": "1s", "1.5us": "1.5µs"} {
		d, err := ParseDuration(in)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := Duration(d).MarshalText()
		if string(got) != want {
			t.Errorf("%s written as %s, want %s", in, got, want)
		}
		back, err := ParseDuration(string(got))
		if err != nil || back != d {
			t.Errorf("%s written as %s reads back as %v, %v", in, got, back, err)
		}
	}
}
