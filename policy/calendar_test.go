package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// TestCalendarRuleErrors checks that every misuse of calendar is refused with an error naming
// the field, on its line.
func TestCalendarRuleErrors(t *testing.T) {
	t.Parallel()
	const head = "rules:\n  - name: a\n    limit: 10\n"
	for _, tc := range []struct {
		name, yml, want string
	}{
		{"unknown zone", head + "    algorithm: fixed_window\n    period: 1d\n    calendar: Mars/Olympus_Mons\n",
			`policy.yaml:6: rules[0].calendar: unknown time zone "Mars/Olympus_Mons"`},
		{"the process's zone", head + "    algorithm: fixed_window\n    period: 1d\n    calendar: Local\n",
			`rules[0].calendar: unknown time zone "Local"`},
		{"not a fixed window", head + "    algorithm: sliding_window_counter\n    period: 1d\n    calendar: UTC\n",
			"policy.yaml:6: rules[0].calendar: applies only to fixed_window, not sliding_window_counter"},
		{"the default algorithm", head + "    period: 1d\n    calendar: true\n",
			"rules[0].calendar: applies only to fixed_window, not token_bucket"},
		{"a period of two days", head + "    algorithm: fixed_window\n    period: 2d\n    calendar: UTC\n",
			"policy.yaml:5: rules[0].period: with calendar must be 1d, 1w, 1mo or 1y, got 2d"},
		{"an hour", head + "    algorithm: fixed_window\n    period: 1h\n    calendar: Europe/Berlin\n",
			"rules[0].period: with calendar must be 1d, 1w, 1mo or 1y, got 1h"},
		{"a month without calendar", head + "    algorithm: fixed_window\n    period: 1mo\n",
			"policy.yaml:5: rules[0].period: 1mo is a calendar period: it needs calendar"},
		{"a year without calendar", head + "    algorithm: token_bucket\n    period: 1y\n",
			"rules[0].period: 1y is a calendar period"},
		{"a tier's period", head + "    algorithm: fixed_window\n    period: 1d\n    calendar: UTC\n    tiers: {free: {period: 12h}}\n",
			"rules[0].tiers.free.period: with calendar must be 1d, 1w, 1mo or 1y, got 12h"},
		{"with global regions", head + "    algorithm: fixed_window\n    period: 1d\n    calendar: UTC\n    regions: global\n",
			`rules[0].calendar: cannot be combined with regions "global"`},
		{"a month written wrong", head + "    algorithm: fixed_window\n    period: 1month\n    calendar: UTC\n",
			`policy.yaml:5: rules[0].period: invalid duration "1month"`},
		{"calendar not a string", head + "    algorithm: fixed_window\n    period: 1d\n    calendar: [UTC]\n",
			"rules[0].calendar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadFiles(map[string][]byte{"policy.yaml": []byte(tc.yml)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCalendarRules compiles calendar rules and checks the calendar reaches the effective
// parameters of the rule, its tiers and an override's limits.
func TestCalendarRules(t *testing.T) {
	t.Parallel()
	snap := mustCompile(t, `
rules:
  - {name: daily, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1d, calendar: Europe/Berlin,
     tiers: {pro: {limit: 5000, period: 1mo}, gold: {period: 1y}}}
  - {name: weekly, key: [tenant], algorithm: fixed_window, limit: 10, period: 1w, calendar: true}
  - {name: monthly, key: [tenant], algorithm: fixed_window, limit: 10, period: 1mo, calendar: Asia/Kolkata}
  - {name: plain, key: [tenant], algorithm: fixed_window, limit: 10, period: 1d, calendar: false}
overrides:
  - {tenant: acme, type: multiplier, value: 2, expires_at: "2099-01-01T00:00:00Z"}
`)
	for _, tc := range []struct {
		rule, tier string
		unit       algorithm.CalendarUnit
		zone       string
		period     time.Duration
	}{
		{"daily", "", algorithm.CalendarDay, "Europe/Berlin", 24 * time.Hour},
		{"daily", "pro", algorithm.CalendarMonth, "Europe/Berlin", 30 * 24 * time.Hour},
		{"daily", "gold", algorithm.CalendarYear, "Europe/Berlin", 365 * 24 * time.Hour},
		{"weekly", "", algorithm.CalendarWeek, "UTC", 7 * 24 * time.Hour},
		{"monthly", "", algorithm.CalendarMonth, "Asia/Kolkata", 30 * 24 * time.Hour},
		{"plain", "", 0, "", 24 * time.Hour},
	} {
		c := snap.Rule(tc.rule)
		spec := &c.base
		if tc.tier != "" {
			spec = c.tiers[tc.tier]
		}
		cal := spec.Params.Calendar()
		if tc.unit == 0 {
			if cal != nil {
				t.Errorf("%s: calendar %s %s, want none", tc.rule, cal.Unit(), cal.Zone())
			}
			continue
		}
		if cal == nil || cal.Unit() != tc.unit || cal.Zone() != tc.zone || spec.Period != tc.period ||
			spec.Params.Period != tc.period.Microseconds() {
			t.Errorf("%s %s: calendar %v, period %s (%dµs); want %s %s, %s", tc.rule, tc.tier, cal, spec.Period, spec.Params.Period, tc.unit, tc.zone, tc.period)
		}
	}
	var sc Scratch
	ls := snap.Resolve(&Request{Tenant: "acme"}, time.Now(), &sc)
	if len(ls) != 4 {
		t.Fatalf("%d limits, want 4", len(ls))
	}
	for _, l := range ls[:3] {
		if l.Override == nil || l.Params.Limit != 2*l.Rule.base.Limit || l.Params.Calendar() != l.Rule.base.Params.Calendar() {
			t.Errorf("%s: override %v, limit %d, calendar %v: the override lost the rule's calendar", l.Rule.Name, l.Override != nil, l.Params.Limit, l.Params.Calendar())
		}
	}
}

// TestCalendarFields reads and writes the calendar field and periods as YAML and the admin
// API's JSON do.
func TestCalendarFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		json string
		zone string
	}{{`true`, "UTC"}, {`false`, ""}, {`"Asia/Kathmandu"`, "Asia/Kathmandu"}, {`""`, ""}} {
		var c Calendar
		if err := json.Unmarshal([]byte(tc.json), &c); err != nil || c.Zone() != tc.zone {
			t.Errorf("%s: zone %q (%v), want %q", tc.json, c.Zone(), err, tc.zone)
		}
	}
	var c Calendar
	if err := json.Unmarshal([]byte(`5`), &c); err == nil {
		t.Error("calendar 5 accepted")
	}
	for _, tc := range []struct {
		in   string
		want time.Duration
		out  string
	}{{"1mo", PeriodMonth, "1mo"}, {"1y", PeriodYear, "1y"}, {"1w", 7 * 24 * time.Hour, "7d"}, {"2w", 14 * 24 * time.Hour, "14d"}, {"1d", 24 * time.Hour, "1d"}} {
		var d Duration
		if err := d.UnmarshalText([]byte(tc.in)); err != nil || time.Duration(d) != tc.want {
			t.Errorf("%s: %s (%v), want %s", tc.in, time.Duration(d), err, tc.want)
		}
		if out, _ := d.MarshalText(); string(out) != tc.out {
			t.Errorf("%s written %s, want %s", tc.in, out, tc.out)
		}
	}
	for _, bad := range []string{"2mo", "1.5y", "w", "1hw", "100w"} {
		var d Duration
		if err := d.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%s read as %s", bad, time.Duration(d))
		}
	}
}

// TestCalendarParseRule reads calendar and on_deny as the admin API sends them.
func TestCalendarParseRule(t *testing.T) {
	t.Parallel()
	r, err := ParseRule("monthly", []byte(`{"key":["tenant"],"algorithm":"fixed_window","limit":10,"period":"1mo","calendar":true,"on_deny":"drain"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Calendar.Zone() != "UTC" || time.Duration(r.Period) != PeriodMonth || r.OnDeny != "drain" {
		t.Fatalf("read %+v", r)
	}
	out, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(out), `"period":"1mo","calendar":"true"`) {
		t.Fatalf("written %s (%v)", out, err)
	}
	if _, err := ParseRule("bad", []byte(`{"algorithm":"fixed_window","limit":10,"period":"1d","calendar":"Nowhere/Land"}`)); err == nil ||
		!strings.Contains(err.Error(), "calendar: unknown time zone") {
		t.Fatalf("unknown zone: %v", err)
	}
}
