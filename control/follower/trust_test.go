package follower_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/internal/key"
)

// adaptivePolicy scales a bucket of 100 per minute (burst 20) by trust.
const adaptivePolicy = `
rules:
  - {name: api, key: [user], algorithm: token_bucket, limit: 100, period: 1m, burst: 20, adaptive: trust}
`

// TestTrustFromTheControlStore: the Runtime compiles adaptive limits from the identities'
// trust and the fleet's violation counts: a user assigned trust 1 gets a rate of 150; each minute
// with denials in the last 30 days takes 0.05 off (soft-only minutes and older ones do not),
// at most 0.2; an API key's violations are found by its hashed form, as the counts keep it.
func TestTrustFromTheControlStore(t *testing.T) {
	c := &fakeClock{}
	c.Advance(time.Duration(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC).UnixNano()))
	st := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{Now: c.Now})
	n := startNode(t, st, "node-a", files(t, adaptivePolicy), func(o *follower.Options) { o.Now = c.Now })
	limit := func(r sluice.Request) int64 {
		t.Helper()
		var d sluice.Decision
		if err := n.lim.Quota(t.Context(), &r, &d); err != nil {
			t.Fatal(err)
		}
		// The rate, which trust scales by 1 + t/2 (the limit a client sees is the burst).
		return d.Results[0].Quota
	}
	one := 1.0
	for _, id := range []control.Identity{
		{Kind: control.IdentityUser, Value: "bob", Trust: &one},
		{Kind: control.IdentityAPIKey, Value: "k1", Trust: &one},
	} {
		got, _, err := st.PutIdentity(t.Context(), alice, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.rt.Sync(t.Context(), got.Version); err != nil {
			t.Fatal(err)
		}
	}
	bob, k1 := sluice.Request{User: "bob"}, sluice.Request{APIKey: "k1", User: "carol"}
	if got := limit(bob); got != 150 {
		t.Fatalf("bob at trust 1: limit %d, want 150", got)
	}

	minute := c.Now().Truncate(time.Minute)
	hashed := string(key.AppendSecret(nil, "k1"))
	var vs []control.ViolationCount
	for i := range 3 { // three minutes with denials in two rules: 3 violation minutes
		m := minute.Add(-time.Duration(i+1) * time.Minute)
		vs = append(vs, control.ViolationCount{Minute: m, Rule: "api", User: "bob", Denied: 2, Limit: 150},
			control.ViolationCount{Minute: m, Rule: "other", User: "bob", Denied: 1, Limit: 10})
	}
	vs = append(vs,
		control.ViolationCount{Minute: minute.Add(-5 * time.Minute), Rule: "api", User: "bob", Soft: 9, Limit: 150},       // soft only
		control.ViolationCount{Minute: minute.Add(-31 * 24 * time.Hour), Rule: "api", User: "bob", Denied: 9, Limit: 150}, // too old
		control.ViolationCount{Minute: minute.Add(-time.Minute), Rule: "api", User: "carol", APIKey: hashed, Denied: 1, Limit: 150},
	)
	if err := st.AddCounts(t.Context(), nil, vs); err != nil {
		t.Fatal(err)
	}
	n.rt.RefreshTrust(t.Context())
	if got := limit(bob); got != 142 {
		t.Errorf("bob, 3 violation minutes (trust 0.85): limit %d, want 142", got)
	}
	if got := limit(k1); got != 147 {
		t.Errorf("k1, 1 violation minute (trust 0.95): limit %d, want 147", got)
	}
	for i := 3; i < 10; i++ {
		vs = []control.ViolationCount{{Minute: minute.Add(-time.Duration(i+1) * time.Minute), Rule: "api", User: "bob", Denied: 1, Limit: 150}}
		if err := st.AddCounts(t.Context(), nil, vs); err != nil {
			t.Fatal(err)
		}
	}
	n.rt.RefreshTrust(t.Context())
	if got := limit(bob); got != 140 {
		t.Errorf("bob, 10 violation minutes (trust 0.8, at most 0.2 off): limit %d, want 140", got)
	}
	// Thirty days on, the violations have aged out: trust 1 again.
	c.Advance(30*24*time.Hour + time.Hour)
	n.rt.RefreshTrust(t.Context())
	if got := limit(bob); got != 150 {
		t.Errorf("bob, violations older than 30 days: limit %d, want 150", got)
	}
}
