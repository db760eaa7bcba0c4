package policy

import (
	"errors"
	"maps"
	"slices"
	"strconv"
)

// StatePatch is a change of the control store's overrides and identity assignments since the
// State a Snapshot was compiled from, for Snapshot.Patch. Removals name the entries as they
// were compiled (an override or an assignment replaced is removed, then added).
type StatePatch struct {
	// Version is the control version the patched snapshot is at.
	Version int64
	// RemovedOverrides are the overrides gone or replaced, as they were.
	RemovedOverrides []StateOverride
	// Overrides are the overrides added, by id.
	Overrides []StateOverride
	// RemovedIdentities are the assignments gone or replaced, as they were.
	RemovedIdentities []Identity
	// Identities are the assignments added.
	Identities []Identity
}

// Patch returns a snapshot that decides as CompileWith would with p applied to the state s
// was compiled from, at a cost in proportion to p rather than to the snapshot: the override
// and identity indexes that p touches are copied (a shallow copy of a map: no override or
// assignment is compiled again) and the rest is shared with s, which stays as it was. Entries
// of p that do not compile are left out and returned as *SkippedError, as CompileWith does.
//
// ok is false when p cannot be patched in: it adds or removes an identity with a trust score
// (adaptive limits are compiled per trust level). Compile the whole state then.
func (s *Snapshot) Patch(p *StatePatch) (_ *Snapshot, skipped []error, ok bool) {
	for _, list := range [][]Identity{p.RemovedIdentities, p.Identities} {
		for i := range list {
			if list[i].Trust != nil {
				return nil, nil, false
			}
		}
	}
	n := *s
	n.controlVersion = p.Version
	n.Version = Version(s.filesVersion, p.Version)
	pt := patcher{s: &n}
	for i := range p.RemovedOverrides {
		pt.removeOverride(&p.RemovedOverrides[i])
	}
	for i := range p.Overrides {
		o := &p.Overrides[i]
		po := o.Override
		c, errs := n.compileOverride(&po, controlSources)
		if c == nil {
			skipped = append(skipped, &SkippedError{Kind: "override", ID: strconv.FormatInt(o.ID, 10), Err: errors.Join(errs...)})
			continue
		}
		c.id = o.ID
		pt.addOverride(c)
	}
	if len(p.RemovedIdentities)+len(p.Identities) > 0 {
		ids := identities{
			trust:       s.ids.trust,
			apiKeys:     maps.Clone(s.ids.apiKeys),
			userTiers:   maps.Clone(s.ids.userTiers),
			tenantTiers: maps.Clone(s.ids.tenantTiers),
		}
		for i := range p.RemovedIdentities {
			ids.remove(&p.RemovedIdentities[i])
		}
		for i := range p.Identities {
			id := &p.Identities[i]
			if err := ids.add(id); err != nil {
				skipped = append(skipped, &SkippedError{Kind: "identity", ID: string(id.Kind) + "/" + id.Value, Err: err})
			}
		}
		ids.some = len(ids.apiKeys)+len(ids.userTiers)+len(ids.tenantTiers) > 0
		n.ids = ids
	}
	return &n, skipped, true
}

// remove takes an assignment out; only the map of its kind holds it.
func (ids *identities) remove(id *Identity) {
	switch id.Kind {
	case IdentityAPIKey:
		delete(ids.apiKeys, id.Value)
	case IdentityUser:
		delete(ids.userTiers, id.Value)
	case IdentityTenant:
		delete(ids.tenantTiers, id.Value)
	}
}

// patcher changes a shallow copy of a snapshot, copying each override index the first time
// it writes to it, so that the snapshot copied from never changes.
type patcher struct {
	s         *Snapshot
	single    [4]bool
	overrides bool
	apiKeys   bool
	shapes    bool
	ips       bool
}

// list returns c's target's list; with write, the index that holds it is first made this
// snapshot's own.
func (pt *patcher) list(c *compiledOverride, write bool) []*compiledOverride {
	s := pt.s
	if c.shape == shapeIP {
		if write && !pt.ips {
			pt.ips = true
			s.ips = slices.Clone(s.ips)
		}
		if i := s.ipIndex(c.ip); i >= 0 {
			return s.ips[i].list
		}
		return nil
	}
	if i := singleIndex(c.shape); i >= 0 {
		if write && !pt.single[i] {
			pt.single[i] = true
			s.single[i] = maps.Clone(s.single[i])
			if s.single[i] == nil {
				s.single[i] = map[string][]*compiledOverride{}
			}
		}
		return s.single[i][c.target.value(c.shape)]
	}
	if write && !pt.overrides {
		pt.overrides = true
		s.overrides = maps.Clone(s.overrides)
		if s.overrides == nil {
			s.overrides = map[target][]*compiledOverride{}
		}
	}
	return s.overrides[c.target]
}

// store puts list back at c's target, or deletes the target when list is empty.
func (pt *patcher) store(c *compiledOverride, list []*compiledOverride) {
	s := pt.s
	if c.shape == shapeIP {
		s.storeIP(c.ip, list)
		return
	}
	if i := singleIndex(c.shape); i >= 0 {
		v := c.target.value(c.shape)
		if len(list) == 0 {
			delete(s.single[i], v)
		} else {
			s.single[i][v] = list
		}
		return
	}
	if len(list) == 0 {
		delete(s.overrides, c.target)
	} else {
		s.overrides[c.target] = list
	}
}

// removeOverride takes the run-time override o out of its target's list.
func (pt *patcher) removeOverride(o *StateOverride) {
	po := o.Override
	c, _ := pt.s.compileOverride(&po, controlSources)
	if c == nil {
		return // it did not compile, so it was never in
	}
	i := slices.IndexFunc(pt.list(c, false), func(x *compiledOverride) bool { return x.id == o.ID })
	if i < 0 {
		return
	}
	pt.store(c, slices.Delete(slices.Clone(pt.list(c, true)), i, i+1))
}

// addOverride puts c into its target's list, after the files' overrides and the run-time
// ones of smaller ids, where CompileWith puts it.
func (pt *patcher) addOverride(c *compiledOverride) {
	s := pt.s
	l := pt.list(c, true)
	i := len(l)
	for i > 0 && l[i-1].id > c.id {
		i--
	}
	pt.store(c, slices.Insert(slices.Clone(l), i, c))
	if c.apiKey != "" && s.apiKeys[c.apiKey] == "" {
		if !pt.apiKeys {
			pt.apiKeys = true
			s.apiKeys = maps.Clone(s.apiKeys)
			if s.apiKeys == nil {
				s.apiKeys = map[string]string{}
			}
		}
		s.apiKeys[c.apiKey] = c.apiKey
	}
	if !slices.Contains(s.shapes, c.shape) {
		if !pt.shapes {
			pt.shapes = true
			s.shapes = slices.Clone(s.shapes)
		}
		s.shapes = append(s.shapes, c.shape)
		b := builder{s: s}
		b.finish()
	}
	if c.kind == overrideWarn {
		s.warns = true
	}
}
