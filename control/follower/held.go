package follower

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// held is the control store's state as the Runtime last read it. Overrides and identity
// assignments, the entries a store holds by the hundred thousand, are kept by id and by kind
// and value, so that a change read with control.ChangeReader is applied to them in place
// (docs/architecture.md, Changes in proportion to their size).
type held struct {
	version    int64
	rules      []policy.APIRule
	exemptions []policy.StateExemption
	domains    []policy.APIDomain
	overrides  map[int64]policy.StateOverride
	identities map[control.IdentityRef]policy.Identity
}

// newHeld keeps st, as read whole.
func newHeld(st *control.State) *held {
	ps := policyState(st)
	h := &held{
		version: ps.Version, rules: ps.Rules, exemptions: ps.Exemptions, domains: ps.Domains,
		overrides:  make(map[int64]policy.StateOverride, len(ps.Overrides)),
		identities: make(map[control.IdentityRef]policy.Identity, len(ps.Identities)),
	}
	for _, o := range ps.Overrides {
		h.overrides[o.ID] = o
	}
	for _, id := range ps.Identities {
		h.identities[control.IdentityRef{Kind: control.IdentityKind(id.Kind), Value: id.Value}] = id
	}
	return h
}

// state returns what is held as CompileWith reads it: overrides by id, assignments by kind
// and value, as Load lists them. It costs in proportion to the store: only a whole compile
// (a rule, an exemption, a domain, the files or a trust score changed) asks for it.
func (h *held) state() *policy.State {
	st := &policy.State{
		Version: h.version, Rules: h.rules, Exemptions: h.exemptions, Domains: h.domains,
		Overrides: slices.SortedFunc(maps.Values(h.overrides), func(a, b policy.StateOverride) int { return cmp.Compare(a.ID, b.ID) }),
		Identities: slices.SortedFunc(maps.Values(h.identities), func(a, b policy.Identity) int {
			return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Value, b.Value))
		}),
	}
	return st
}

// apply brings h to d.Version and returns the same change as a patch of the snapshot
// compiled from h: the entries removed as they were held, then the ones written.
func (h *held) apply(d *control.Delta) *policy.StatePatch {
	p := &policy.StatePatch{Version: d.Version}
	for _, id := range d.RemovedOverrides {
		if o, ok := h.overrides[id]; ok {
			p.RemovedOverrides = append(p.RemovedOverrides, o)
			delete(h.overrides, id)
		}
	}
	for i := range d.Overrides {
		o := &d.Overrides[i]
		if old, ok := h.overrides[o.ID]; ok {
			p.RemovedOverrides = append(p.RemovedOverrides, old)
		}
		so := policy.StateOverride{ID: o.ID, Override: PolicyOverride(o)}
		h.overrides[o.ID] = so
		p.Overrides = append(p.Overrides, so)
	}
	for _, ref := range d.RemovedIdentities {
		if id, ok := h.identities[ref]; ok {
			p.RemovedIdentities = append(p.RemovedIdentities, id)
			delete(h.identities, ref)
		}
	}
	for i := range d.Identities {
		id := &d.Identities[i]
		ref := control.IdentityRef{Kind: id.Kind, Value: id.Value}
		if old, ok := h.identities[ref]; ok {
			p.RemovedIdentities = append(p.RemovedIdentities, old)
		}
		pid := policy.Identity{
			Kind: policy.IdentityKind(id.Kind), Value: id.Value,
			Tier: id.Tier, Tenant: id.Tenant, User: id.User, Trust: id.Trust,
		}
		h.identities[ref] = pid
		p.Identities = append(p.Identities, pid)
	}
	h.version = d.Version
	return p
}

// loadChanges reads what changed since the version held and patches it into the snapshot,
// when the store can tell (control.ChangeReader) and the change is one a patch carries. It
// reports false when the store must be read whole instead: no state held yet, a store that
// cannot read changes, a Full delta, or a failed read (whose whole read then tells whether
// the store is down). r.loadMu is held.
func (r *Runtime) loadChanges(ctx context.Context, why string) (bool, error) {
	cr, ok := r.o.Store.(control.ChangeReader)
	r.mu.Lock()
	h := r.held
	r.mu.Unlock()
	if !ok || h == nil {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	d, err := cr.Changes(cctx, h.version)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return true, err
		}
		r.log.Debug("control store: reading the changes failed; reading it whole", "err", err)
		return false, nil
	}
	if d.Full {
		return false, nil
	}
	r.setUp(nil)
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Version == h.version {
		return true, nil
	}
	from := h.version
	p := h.apply(d)
	cur := r.o.Limiter.Policy()
	if cur.FilesVersion() != r.files.Version || cur.ControlVersion() != from {
		return true, r.compileLocked(why)
	}
	next, skipped, ok := cur.Patch(p)
	if !ok {
		notify(r.trustNow) // a trust score changed
		return true, r.compileLocked(why)
	}
	return true, r.swapLocked(next, skipped, why)
}
