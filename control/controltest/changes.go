package controltest

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// heldState is what a node holds of the store: active overrides by id, assignments by
// kind and value, as Load gives them and as Changes keeps them.
type heldState struct {
	overrides  map[int64]control.Override
	identities map[control.IdentityRef]control.Identity
}

func held(st *control.State) heldState {
	h := heldState{overrides: map[int64]control.Override{}, identities: map[control.IdentityRef]control.Identity{}}
	for _, o := range st.Overrides {
		h.overrides[o.ID] = o
	}
	for _, id := range st.Identities {
		h.identities[control.IdentityRef{Kind: id.Kind, Value: id.Value}] = id
	}
	return h
}

// apply applies d as a node does: removals first, then what was written; expired overrides
// are dropped as Load drops them.
func (h heldState) apply(d *control.Delta) {
	for _, id := range d.RemovedOverrides {
		delete(h.overrides, id)
	}
	for _, o := range d.Overrides {
		if o.ExpiresAt.After(d.At) {
			h.overrides[o.ID] = o
		}
	}
	for _, r := range d.RemovedIdentities {
		delete(h.identities, r)
	}
	for _, id := range d.Identities {
		h.identities[control.IdentityRef{Kind: id.Kind, Value: id.Value}] = id
	}
}

func (h heldState) String() string { return fmt.Sprintf("%v %v", h.overrides, h.identities) }

// testChanges: applying Changes(since) to what Load gave at since gives what Load gives
// now, after each kind of change to overrides and assignments (create, replace under
// If-Match, delete, expire, put, put again, delete) and a token change, which carries
// nothing. A rule, an exemption or a domain change, a delta past MaxDeltaVersions, and
// audit events pruned make a Full delta.
func testChanges(t *testing.T, e *env) {
	cr, ok := e.s.(control.ChangeReader)
	if !ok {
		t.Fatal("the store does not implement control.ChangeReader")
	}
	load := func() (*control.State, heldState) {
		t.Helper()
		st, err := e.s.Load(e.ctx)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		return st, held(st)
	}
	st, h := load()
	if d, err := cr.Changes(e.ctx, st.Version); err != nil || d.Full || d.Version != st.Version {
		t.Fatalf("Changes at the current version = %+v, %v", d, err)
	}
	var banID, shortID int64
	steps := []struct {
		name string
		fn   func() error
	}{
		{"create", func() error {
			o, err := e.s.CreateOverride(e.ctx, ch(""), e.override("acme", "", time.Hour))
			banID = o.ID
			return err
		}},
		{"create short-lived", func() error {
			o, err := e.s.CreateOverride(e.ctx, ch(""), e.override("beta", "", time.Minute))
			shortID = o.ID
			return err
		}},
		{"replace under If-Match", func() error {
			o := e.override("acme", "", 2*time.Hour)
			o.Type, o.Value = control.OverrideBan, 0
			_, err := e.s.CreateOverride(e.ctx, ch("*"), o)
			return err
		}},
		{"put identities", func() error {
			for _, v := range []string{"k1", "k2"} {
				if _, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityAPIKey, Value: v, Tier: "gold"}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"put again", func() error {
			_, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityAPIKey, Value: "k1", Tier: "free", Tenant: "acme"})
			return err
		}},
		{"delete identity", func() error {
			_, err := e.s.DeleteIdentity(e.ctx, ch(""), control.IdentityAPIKey, "k2")
			return err
		}},
		{"token", func() error {
			_, err := e.s.CreateToken(e.ctx, ch(""), control.Token{Name: "ops", Role: control.RoleRead, Hash: control.HashToken("changes-secret")})
			return err
		}},
		{"expire", func() error {
			e.clock.Advance(2 * time.Minute)
			_, _, err := e.s.Expire(e.ctx)
			return err
		}},
		{"delete override", func() error {
			o, err := e.s.CreateOverride(e.ctx, ch(""), e.override("gamma", "", time.Hour))
			if err != nil {
				return err
			}
			_, err = e.s.DeleteOverride(e.ctx, ch(""), o.ID)
			return err
		}},
	}
	from, base := st.Version, h
	for _, s := range steps {
		if err := s.fn(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		now, want := load()
		// From the version before this step, and from the start: a delta spans any number
		// of changes.
		for _, c := range []struct {
			since int64
			held  heldState
		}{{from, h}, {st.Version, base}} {
			d, err := cr.Changes(e.ctx, c.since)
			if err != nil || d.Full || d.Since != c.since || d.Version != now.Version {
				t.Fatalf("%s: Changes(%d) = %+v, %v; want a delta to %d", s.name, c.since, d, err, now.Version)
			}
			got := c.held.clone()
			got.apply(d)
			if got.String() != want.String() {
				t.Errorf("%s: Changes(%d) applied gives\n%v\nLoad gives\n%v", s.name, c.since, got, want)
			}
		}
		from, h = now.Version, want
	}
	if banID == 0 || shortID == 0 {
		t.Fatal("no overrides created")
	}

	// Changes a delta does not carry.
	v := e.version()
	if _, err := e.s.CreateRule(e.ctx, ch(""), "r1", []byte(`{"limit": 1}`)); err != nil {
		t.Fatal(err)
	}
	if d, err := cr.Changes(e.ctx, v); err != nil || !d.Full {
		t.Errorf("after a rule change: Changes = %+v, %v; want Full", d, err)
	}
	if d, err := cr.Changes(e.ctx, e.version()-control.MaxDeltaVersions-1); err != nil || !d.Full {
		t.Errorf("past MaxDeltaVersions: Changes = %+v, %v; want Full", d, err)
	}
	v = e.version()
	if _, _, err := e.s.PutIdentity(e.ctx, ch(""), control.Identity{Kind: control.IdentityUser, Value: "u", Tier: "gold"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	if _, err := e.s.PruneAudit(e.ctx, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if d, err := cr.Changes(e.ctx, v); err != nil || !d.Full {
		t.Errorf("with the audit events pruned: Changes = %+v, %v; want Full", d, err)
	}
}

func (h heldState) clone() heldState {
	return heldState{overrides: maps.Clone(h.overrides), identities: maps.Clone(h.identities)}
}
