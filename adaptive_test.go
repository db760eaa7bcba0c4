package sluice_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// adaptivePolicy scales a bucket (limit 100 per minute, burst 20, tier pro 1000) and a window
// by trust; the last rule is not adaptive.
const adaptivePolicy = `
rules:
  - {name: bucket, match: {endpoint: /b}, key: [user], algorithm: token_bucket, limit: 100, period: 1m, burst: 20, tiers: {pro: {limit: 1000}}, adaptive: trust}
  - {name: window, match: {endpoint: /w}, key: [user], algorithm: fixed_window, limit: 100, period: 1m, adaptive: trust}
  - {name: fixed, match: {endpoint: /b}, key: [user], algorithm: gcra, limit: 500, period: 1m, burst: 50}
`

// TestAdaptiveLimits: a rule with adaptive: trust scales each caller's limits by its trust
// score t (burst × (1 + t), rate × (1 + t/2)), and the decision shows the effective limit.
// The score is the API key's, else the user's, else the tenant's, less 0.05 per violation
// minute and at most 0.2 less. Rules without adaptive keep their limits.
func TestAdaptiveLimits(t *testing.T) {
	files, err := policy.ParseFiles(map[string][]byte{"p.yaml": []byte(adaptivePolicy)})
	if err != nil {
		t.Fatal(err)
	}
	trust := func(v float64) *float64 { return &v }
	st := &policy.State{Version: 1, Identities: []policy.Identity{
		{Kind: policy.IdentityUser, Value: "zero", Trust: trust(0)},
		{Kind: policy.IdentityUser, Value: "half", Trust: trust(0.5)},
		{Kind: policy.IdentityUser, Value: "full", Trust: trust(1)},
		{Kind: policy.IdentityUser, Value: "full-2-violations", Trust: trust(1)},
		{Kind: policy.IdentityUser, Value: "full-9-violations", Trust: trust(1)},
		{Kind: policy.IdentityUser, Value: "low-4-violations", Trust: trust(0.15)},
		{Kind: policy.IdentityUser, Value: "full-pro", Trust: trust(1)},
		{Kind: policy.IdentityUser, Value: "zero-key", Trust: trust(0)},
		{Kind: policy.IdentityAPIKey, Value: "k-full", Trust: trust(1)},
		{Kind: policy.IdentityTenant, Value: "trusted-co", Trust: trust(0.5)},
	}}
	violations := map[string]int{"full-2-violations": 2, "full-9-violations": 9, "low-4-violations": 4}
	snap, skipped := policy.CompileWith(files, st, testutil.Start, policy.WithViolationMinutes(func(kind policy.IdentityKind, v string) int {
		return violations[v]
	}))
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	c := testutil.NewClock()
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), snap, sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name string
		req  sluice.Request
		// trust is the score expected; limit the bucket's effective limit, left what its
		// burst leaves after one request; window the window's limit.
		trust             float64
		limit, left, wind int64
	}{
		{"no score", sluice.Request{User: "nobody"}, 0, 100, 19, 100},
		{"t=0", sluice.Request{User: "zero"}, 0, 100, 19, 100},
		{"t=0.5", sluice.Request{User: "half"}, 0.5, 125, 29, 125},
		{"t=1", sluice.Request{User: "full"}, 1, 150, 39, 150},
		{"t=1, 2 violation minutes: 0.9", sluice.Request{User: "full-2-violations"}, 0.9, 145, 37, 145},
		{"t=1, 9 violation minutes: at most 0.2 off", sluice.Request{User: "full-9-violations"}, 0.8, 140, 35, 140},
		{"t=0.15, 4 violation minutes: not below 0", sluice.Request{User: "low-4-violations"}, 0, 100, 19, 100},
		{"t=1 by the API key, before its user's", sluice.Request{APIKey: "k-full", User: "zero-key"}, 1, 150, 39, 150},
		{"t=0.5 by the tenant", sluice.Request{Tenant: "trusted-co", User: "staff"}, 0.5, 125, 29, 125},
		{"a tier, t=1", sluice.Request{User: "full-pro", Tier: "pro"}, 1, 1500, 1999, 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := snap.TrustOf(&tc.req); got != tc.trust {
				t.Errorf("TrustOf = %v, want %v", got, tc.trust)
			}
			var d sluice.Decision
			r := tc.req
			r.Endpoint = "/b"
			if err := l.Check(ctx, &r, &d); err != nil {
				t.Fatal(err)
			}
			b, fixed := d.Results[0], d.Results[1]
			// A bucket's limit is its burst (what can be spent at once); its rate is the quota.
			if b.Rule != "bucket" || b.Quota != tc.limit || b.Limit != tc.left+1 || b.Remaining != tc.left {
				t.Errorf("bucket: quota %d, limit %d, remaining %d; want %d, %d, %d", b.Quota, b.Limit, b.Remaining, tc.limit, tc.left+1, tc.left)
			}
			if fixed.Quota != 500 || fixed.Limit != 50 || fixed.Remaining != 49 {
				t.Errorf("a rule without adaptive: quota %d, limit %d, remaining %d; want 500, 50, 49", fixed.Quota, fixed.Limit, fixed.Remaining)
			}
			r.Endpoint = "/w"
			if err := l.Check(ctx, &r, &d); err != nil {
				t.Fatal(err)
			}
			if w := d.Results[0]; w.Limit != tc.wind || w.Remaining != tc.wind-1 || d.Limit != tc.wind {
				t.Errorf("window: limit %d (decision %d), remaining %d; want %d", w.Limit, d.Limit, w.Remaining, tc.wind)
			}
		})
	}
	// Compiled per identity: a check of a trusted caller allocates nothing.
	r := sluice.Request{User: "full", Endpoint: "/b"}
	var d sluice.Decision
	if n := testing.AllocsPerRun(100, func() {
		req := r
		l.Check(ctx, &req, &d)
	}); n != 0 {
		t.Errorf("%v allocations per adaptive check, want 0", n)
	}
	if got := policy.EffectiveTrust(0.3, 1); got != 0.25 {
		t.Errorf("EffectiveTrust(0.3, 1) = %v, want 0.25", got)
	}
}
