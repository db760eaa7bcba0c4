package sluice_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
)

const globalShadowPolicy = `
rules:
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: scanner, match: {endpoint: /scan}, key: [user], algorithm: fixed_window, limit: 1, period: 1h, on_store_error: closed}
overrides:
  - {tenant: bad, type: ban, expires_at: "2026-11-23T13:00:00Z", reason: scraping}
  - {tenant: worse, rule: per-user, type: ban, expires_at: "2026-11-23T13:00:00Z", reason: abuse}
`

// TestGlobalShadow: with WithShadow every limit, ban and quota is decided and reported but
// no request is denied, and a limit over its limit consumes nothing (as a shadow rule).
func TestGlobalShadow(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	st := memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0))
	l, err := sluice.New(st, testutil.Snapshot(t, globalShadowPolicy), sluice.WithClock(c.Now), sluice.WithShadow())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })

	for _, tc := range []struct {
		name       string
		req        sluice.Request
		wantShadow bool // a limit or ban would have denied it
	}{
		{"first request within the limit", sluice.Request{User: "ann"}, false},
		{"second over the limit", sluice.Request{User: "ann"}, true},
		{"third, nothing consumed by the second", sluice.Request{User: "ann"}, true},
		{"banned tenant, no rule applies", sluice.Request{Tenant: "bad"}, true},
		{"banned from a rule", sluice.Request{Tenant: "worse", User: "bob"}, true},
		{"two rules, one over", sluice.Request{User: "ann", Endpoint: "/scan"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := check(t, l, tc.req)
			if !d.Allowed || d.Shadow != tc.wantShadow {
				t.Fatalf("allowed=%v shadow=%v, want allowed and shadow=%v: %+v", d.Allowed, d.Shadow, tc.wantShadow, d)
			}
			for _, r := range d.Results {
				if !r.Shadow {
					t.Fatalf("result of %s not marked shadow", r.Rule)
				}
			}
		})
	}
	// The requests over per-user consumed nothing from it: ann used the one she was allowed.
	var d sluice.Decision
	if err := l.Quota(ctx, &sluice.Request{User: "ann"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Results[0].Remaining != 0 {
		t.Fatalf("per-user remaining %d, want 0 (one used)", d.Results[0].Remaining)
	}
}

// TestGlobalShadowDescriptors: the RLS path under WithShadow answers OK for descriptors over
// their limit, per-request limit overrides and quota_mode included, each marked Shadow.
func TestGlobalShadowDescriptors(t *testing.T) {
	t.Parallel()
	cfg, err := envoyconf.Load(map[string][]byte{"ai.yaml": []byte(quotaDomain)}, false)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sluice.New(memory.New(memory.WithSweepInterval(0)), testutil.Snapshot(t, "rules: []\n").WithEnvoy(cfg, "v1"), sluice.WithShadow())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	backendA := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "backend", Value: "a"}}}
	override := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "user", Value: "x"}}, Limit: &sluice.DescriptorLimit{RequestsPerUnit: 1, Unit: "hour"}}
	for i := range 3 {
		req := sluice.DescriptorRequest{Domain: "ai", Descriptors: []sluice.Descriptor{backendA, override}}
		var d sluice.DescriptorDecision
		if err := l.CheckDescriptors(ctx, &req, &d); err != nil {
			t.Fatal(err)
		}
		over := i > 0
		if !d.OK {
			t.Fatalf("request %d denied under global shadow: %+v", i, d.Statuses)
		}
		for j, st := range d.Statuses {
			if !st.OK || st.Shadow != over {
				t.Fatalf("request %d descriptor %d: ok=%v shadow=%v, want ok and shadow=%v", i, j, st.OK, st.Shadow, over)
			}
		}
	}
}
