package policy

import (
	"strings"
	"testing"
	"time"
)

func TestOnDenyErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yml, want string
	}{
		{"unknown value", "rules:\n  - name: a\n    limit: 10\n    period: 1s\n    on_deny: drop\n", `policy.yaml:5: rules[0].on_deny: "drop" is not drain`},
		{"sliding window counter", "rules:\n  - name: a\n    limit: 10\n    period: 1s\n    algorithm: sliding_window_counter\n    on_deny: drain\n",
			"policy.yaml:6: rules[0].on_deny: drain applies to token_bucket, gcra, leaky_bucket, fixed_window and sliding_window_log, not sliding_window_counter"},
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

// TestOnDenyDrain checks that on_deny: drain reaches the effective parameters of a rule, its
// tiers and an override's limits, and only its own.
func TestOnDenyDrain(t *testing.T) {
	t.Parallel()
	snap := mustCompile(t, `
rules:
  - {name: bucket, key: [tenant], algorithm: gcra, limit: 10, period: 1s, on_deny: drain, tiers: {pro: {limit: 100}}}
  - {name: window, key: [tenant], algorithm: fixed_window, limit: 10, period: 1d, calendar: UTC, on_deny: drain}
  - {name: log, key: [tenant], algorithm: sliding_window_log, limit: 10, period: 1m, on_deny: drain}
  - {name: plain, key: [tenant], algorithm: token_bucket, limit: 10, period: 1s}
overrides:
  - {tenant: acme, type: custom, limit: 3, expires_at: "2099-01-01T00:00:00Z"}
`)
	if !snap.Rule("bucket").tiers["pro"].Params.Drains() {
		t.Error("a tier lost on_deny")
	}
	var sc Scratch
	for _, tenant := range []string{"acme", "other"} {
		ls := snap.Resolve(&Request{Tenant: tenant}, time.Now(), &sc)
		if len(ls) != 4 {
			t.Fatalf("%d limits", len(ls))
		}
		for _, l := range ls {
			if l.Params.Drains() != (l.Rule.Name != "plain") {
				t.Errorf("%s %s: drains %v", tenant, l.Rule.Name, l.Params.Drains())
			}
			if tenant == "acme" && l.Params.Limit != 3 {
				t.Errorf("acme %s: limit %d, want the override's 3", l.Rule.Name, l.Params.Limit)
			}
		}
	}
}
