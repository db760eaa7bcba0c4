package follower_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
)

// changeStore counts the whole reads (Load) and the reads of changes of the store it wraps.
type changeStore struct {
	control.Store
	loads, changes atomic.Int64
}

func (s *changeStore) Load(ctx context.Context) (*control.State, error) {
	s.loads.Add(1)
	return s.Store.Load(ctx)
}

func (s *changeStore) Changes(ctx context.Context, since int64) (*control.Delta, error) {
	s.changes.Add(1)
	return s.Store.(control.ChangeReader).Changes(ctx, since)
}

// TestFollowsChangesWithoutReadingWhole: a node follows bans, their deletion and identity
// assignments by reading the changes alone (no Load after the first), and enforces each
// through Sync as the admin API calls it; a rule change, which a patch does not carry, is read
// whole and compiled with everything held, patched entries included.
func TestFollowsChangesWithoutReadingWhole(t *testing.T) {
	st := &changeStore{Store: openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})}
	for i := range 100 {
		ban(t, st.Store, fmt.Sprint("held-", i))
	}
	n := startNode(t, st, "node-a", files(t, basePolicy+`
  - {name: gold-only, match: {tier: gold}, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
`))
	loads := st.loads.Load()
	sync := func(v int64) {
		t.Helper()
		if err := n.rt.Sync(t.Context(), v); err != nil {
			t.Fatalf("Sync(%d): %v", v, err)
		}
	}
	for i := range 20 {
		tenant := fmt.Sprint("new-", i)
		o := ban(t, st.Store, tenant)
		sync(o.Version)
		if n.allowed(t, sluice.Request{Tenant: tenant, User: "u"}) {
			t.Fatalf("%s allowed after its ban was synced", tenant)
		}
		if i%2 == 0 {
			v, err := st.DeleteOverride(t.Context(), alice, o.ID)
			if err != nil {
				t.Fatal(err)
			}
			sync(v)
			if !n.allowed(t, sluice.Request{Tenant: tenant, User: "u"}) {
				t.Fatalf("%s denied after its ban was deleted", tenant)
			}
		}
	}
	id, _, err := st.PutIdentity(t.Context(), alice, control.Identity{Kind: control.IdentityAPIKey, Value: "k1", Tier: "gold", User: "paid"})
	if err != nil {
		t.Fatal(err)
	}
	sync(id.Version)
	if !n.allowed(t, sluice.Request{APIKey: "k1"}) || n.allowed(t, sluice.Request{APIKey: "k1"}) {
		t.Error("k1's assigned gold tier not enforced: gold-only allows one request")
	}
	if got := st.loads.Load(); got != loads {
		t.Errorf("%d whole reads for 31 changes, want 0 (%d reads of changes)", got-loads, st.changes.Load())
	}
	r, err := st.CreateRule(t.Context(), alice, "api-rule", []byte(`{"key": ["tenant"], "algorithm": "fixed_window", "limit": 1, "period": "1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	sync(r.Version)
	if st.loads.Load() == loads {
		t.Error("a rule change was not read whole")
	}
	for i := range 20 {
		tenant := fmt.Sprint("new-", i)
		if got, want := n.allowed(t, sluice.Request{Tenant: tenant, User: "u"}), i%2 == 0; got != want {
			t.Errorf("after the whole compile: %s allowed %v, want %v", tenant, got, want)
		}
	}
	if n.allowed(t, sluice.Request{Tenant: "held-7", User: "u"}) {
		t.Error("held-7, banned before start, allowed after the whole compile")
	}
	if n.allowed(t, sluice.Request{APIKey: "k1"}) {
		t.Error("k1 allowed past gold-only after the whole compile")
	}
}
