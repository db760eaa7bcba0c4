package sluice_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
)

// TestIdentityAssignmentsWin: Check, Quota and Reset decide a request with the tenant, user
// and tier that identity assignments give it, not the ones it claims, and Check allocates
// nothing more for it.
func TestIdentityAssignmentsWin(t *testing.T) {
	files, err := policy.ParseFiles(map[string][]byte{"p.yaml": []byte(`
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 5, period: 1m, tiers: {free: {limit: 2}, premium: {limit: 100}}}
  - {name: acme, match: {tenant: acme}, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}
`)})
	if err != nil {
		t.Fatal(err)
	}
	snap, skipped := policy.CompileWith(files, &policy.State{Version: 1, Identities: []policy.Identity{
		{Kind: policy.IdentityAPIKey, Value: "k-acme", Tenant: "acme", User: "bob"},
		{Kind: policy.IdentityUser, Value: "bob", Tier: "free"},
	}}, testutil.Start)
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	l := testutil.Limiter(t, "rules: [{name: x, key: [], limit: 1, period: 1s}]", testutil.NewClock())
	if err := l.SetPolicy(snap); err != nil {
		t.Fatal(err)
	}

	// The key claims another tenant and user and the premium tier; it is acme's bob, free.
	claim := sluice.Request{APIKey: "k-acme", Tenant: "evil", User: "mallory", Tier: "premium"}
	var d sluice.Decision
	if err := l.Quota(ctx, &claim, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Results) != 2 || d.Results[0].Limit != 2 || d.Results[1].Rule != "acme" {
		t.Fatalf("Quota for the key: %+v", d.Results)
	}
	for i, want := range []bool{true, true, false} {
		if d := check(t, l, claim); d.Allowed != want || d.Rule != "per-user" || d.Limit != 2 {
			t.Fatalf("check %d: allowed %v rule %s limit %d", i, d.Allowed, d.Rule, d.Limit)
		}
	}
	// bob of acme is the same bucket, whichever way he comes.
	if d := check(t, l, sluice.Request{Tenant: "acme", User: "bob"}); d.Allowed {
		t.Error("acme's bob is allowed after his key spent his free tier")
	}
	if claim.Tenant != "evil" || claim.Tier != "premium" {
		t.Errorf("the caller's request was modified: %+v", claim)
	}
	// Reset by the key addresses acme's bob.
	if n, err := l.Reset(ctx, &sluice.Request{APIKey: "k-acme"}, "per-user"); err != nil || n != 1 {
		t.Fatalf("Reset = %d, %v", n, err)
	}
	if d := check(t, l, sluice.Request{Tenant: "acme", User: "bob"}); !d.Allowed {
		t.Error("acme's bob is still denied after a reset by his key")
	}

	if n := testing.AllocsPerRun(100, func() { l.Check(ctx, &claim, &d) }); n != 0 {
		t.Errorf("Check with an assignment allocates %v times", n)
	}
}
