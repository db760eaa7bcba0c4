package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// TestConcurrencyRules: a concurrency rule takes a limit and no period (nor a tier's), and
// refuses what only a rate has (on_deny: drain, calendar) or what regions cannot share.
func TestConcurrencyRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yml, want string
	}{
		{"period", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, period: 1m}\n", "rules[0].period: not taken by concurrency"},
		{"tier period", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, tiers: {pro: {limit: 4, period: 1m}}}\n", "rules[0].tiers.pro.period: not taken by concurrency"},
		{"drain", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, on_deny: drain}\n", "rules[0].on_deny: drain applies to"},
		{"regions", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, regions: global}\n", "rules[0].regions: rule \"a\": concurrency limits are per region"},
		{"home region", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, regions: \"home:eu\"}\n", "concurrency limits are per region"},
		{"calendar", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, calendar: UTC}\n", "calendar"},
		{"burst", "rules:\n  - {name: a, algorithm: concurrency, limit: 2, burst: 5}\n", "rules[0].burst: applies only to"},
		{"no limit", "rules:\n  - {name: a, algorithm: concurrency}\n", "rules[0].limit: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadFiles(map[string][]byte{"policy.yaml": []byte(tc.yml)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	snap := mustCompile(t, `
rules:
  - {name: jobs, key: [tenant], algorithm: concurrency, limit: 2, tiers: {pro: {limit: 8}}}
`)
	for tier, want := range map[string]int64{"": 2, "pro": 8} {
		ls := snap.Resolve(&Request{Tenant: "acme", Tier: tier}, time.Now(), &Scratch{})
		if len(ls) != 1 || ls[0].Params.Kind != algorithm.Concurrency || ls[0].Params.Limit != want || ls[0].Params.Period != 0 {
			t.Fatalf("tier %q: %+v, want one concurrency limit of %d", tier, ls, want)
		}
	}
}
