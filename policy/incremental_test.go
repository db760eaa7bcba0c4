package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/key"
)

// decisionOf renders what s decides for r: for each limit its rule, key, numbers, ban,
// warning and the override that shaped it, after identity assignment.
func decisionOf(s *Snapshot, r Request) string {
	var sc Scratch
	var scratch Request
	rr := s.Assign(&r, &scratch)
	out := fmt.Sprintf("exempt=%v ", s.Exempt(rr))
	for _, l := range s.Resolve(rr, now, &sc) {
		reason, source, _ := l.OverrideReason()
		out += fmt.Sprintf("[%s %s %d/%d banned=%v warn=%q %s/%s] ", l.Rule.Name, l.Key, l.Spec.Limit, l.Spec.Burst, l.Banned, l.Warning, reason, source)
	}
	return out
}

// TestPatchDecidesAsCompileWith is the property Snapshot.Patch promises: after any sequence
// of patches, the patched snapshot decides every request as CompileWith decides it on the
// state with the same changes applied. Overrides of every shape and type, on targets that
// collide (same attribute, another rule; same id replaced), identities of every kind; the
// requests name the values the state uses, and some it does not.
// testIPs are the ip targets of TestPatchDecidesAsCompileWith: nested prefixes, so that the
// longest-prefix order matters.
var testIPs = []string{"10.0.0.1", "10.0.0.0/24", "10.0.0.0/8", "2001:db8::/32"}

func TestPatchDecidesAsCompileWith(t *testing.T) {
	f := mustFiles(t, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 10, period: 1s, tiers: {gold: {limit: 100}, free: {limit: 2}}}
  - {name: acme-only, match: {tenant: t1}, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1m}
  - {name: per-key, key: [api_key], algorithm: fixed_window, limit: 50, period: 1m}
overrides:
  - {tenant: t2, type: custom, limit: 4, expires_at: "2027-01-01T00:00:00Z", reason: from the file}
  - {user: u1, type: ban, expires_at: "2027-01-01T00:00:00Z", reason: file ban}
exemptions:
  - {user: u3}
`)
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 29))
			pick := func(prefix string, n int) string {
				if rng.IntN(3) == 0 {
					return ""
				}
				return fmt.Sprint(prefix, rng.IntN(n))
			}
			randOverride := func(id int64) StateOverride {
				o := Override{Tenant: pick("t", 4), User: pick("u", 4), APIKey: pick("k", 4), Source: SourceAPI, Reason: fmt.Sprint("r", id)}
				if rng.IntN(4) == 0 {
					o.Endpoint = fmt.Sprint("/e", rng.IntN(2))
				}
				if o.Tenant+o.User+o.APIKey+o.Endpoint == "" {
					o.Tenant = "t0"
				}
				switch rng.IntN(6) {
				case 0: // an ip target stands alone
					o = Override{IP: testIPs[rng.IntN(len(testIPs))], Source: SourceAPI, Reason: o.Reason}
				case 1: // the key by its hash, as the abuse detector names it
					if o.APIKey != "" {
						o.APIKey, o.APIKeyHash = "", key.HashedAPIKey(o.APIKey)
					}
				}
				if rng.IntN(3) == 0 {
					o.Rule = []string{"per-user", "acme-only", "no-such-rule"}[rng.IntN(3)]
				}
				o.ExpiresAt = now.Add(time.Hour)
				if rng.IntN(8) == 0 {
					o.ExpiresAt = now.Add(-time.Minute) // held until the store expires it
				}
				switch rng.IntN(4) {
				case 0:
					o.Type = OverrideBan
				case 1:
					o.Type, o.Value = OverrideMultiplier, []float64{0.5, 2, 3}[rng.IntN(3)]
				case 2:
					o.Type, o.Limit = OverrideCustom, int64(1+rng.IntN(50))
				default:
					o.Type = OverrideWarn
				}
				return StateOverride{ID: id, Override: o}
			}
			randIdentity := func() Identity {
				id := Identity{Kind: []IdentityKind{IdentityAPIKey, IdentityUser, IdentityTenant}[rng.IntN(3)], Tier: []string{"", "gold", "free"}[rng.IntN(3)]}
				switch id.Kind {
				case IdentityAPIKey:
					id.Value, id.Tenant, id.User = fmt.Sprint("k", rng.IntN(4)), pick("t", 4), pick("u", 4)
				case IdentityUser:
					id.Value = fmt.Sprint("u", rng.IntN(4))
				default:
					id.Value = fmt.Sprint("t", rng.IntN(4))
				}
				return id
			}
			overrides := map[int64]StateOverride{}
			ids := map[string]Identity{}
			nextID := int64(1)
			for range 30 {
				overrides[nextID] = randOverride(nextID)
				nextID++
				id := randIdentity()
				ids[string(id.Kind)+"/"+id.Value] = id
			}
			state := func(v int64) *State {
				st := &State{Version: v}
				for _, id := range slices.Sorted(maps.Keys(overrides)) {
					st.Overrides = append(st.Overrides, overrides[id])
				}
				for _, k := range slices.Sorted(maps.Keys(ids)) {
					st.Identities = append(st.Identities, ids[k])
				}
				return st
			}
			snap, _ := CompileWith(f, state(1), now)
			var reqs []Request
			for range 200 {
				reqs = append(reqs, Request{Tenant: pick("t", 5), User: pick("u", 5), APIKey: pick("k", 5), Endpoint: fmt.Sprint("/e", rng.IntN(3)), Tier: pick("tier", 1),
					IP: []string{"", "10.0.0.1", "10.0.0.9", "10.1.0.1", "2001:db8::1", "192.0.2.1"}[rng.IntN(6)]})
			}
			for v := int64(2); v < 40; v++ {
				p := &StatePatch{Version: v}
				for range rng.IntN(4) {
					switch rng.IntN(3) {
					case 0: // create
						o := randOverride(nextID)
						nextID++
						overrides[o.ID] = o
						p.Overrides = append(p.Overrides, o)
					default: // delete or replace one
						if len(overrides) == 0 {
							continue
						}
						keys := slices.Sorted(maps.Keys(overrides))
						old := overrides[keys[rng.IntN(len(keys))]]
						delete(overrides, old.ID)
						if i := slices.IndexFunc(p.Overrides, func(o StateOverride) bool { return o.ID == old.ID }); i >= 0 {
							p.Overrides = slices.Delete(p.Overrides, i, i+1) // added by this patch
						} else {
							p.RemovedOverrides = append(p.RemovedOverrides, old)
						}
						if rng.IntN(2) == 0 {
							o := randOverride(nextID)
							nextID++
							o.Tenant, o.User, o.APIKey, o.Endpoint, o.Rule = old.Tenant, old.User, old.APIKey, old.Endpoint, old.Rule
							o.IP, o.APIKeyHash = old.IP, old.APIKeyHash
							overrides[o.ID] = o
							p.Overrides = append(p.Overrides, o)
						}
					}
				}
				for range rng.IntN(3) {
					id := randIdentity()
					k := string(id.Kind) + "/" + id.Value
					if old, ok := ids[k]; ok {
						delete(ids, k)
						if i := slices.IndexFunc(p.Identities, func(x Identity) bool { return x.Kind == id.Kind && x.Value == id.Value }); i >= 0 {
							p.Identities = slices.Delete(p.Identities, i, i+1) // put by this patch
						} else {
							p.RemovedIdentities = append(p.RemovedIdentities, old)
						}
					}
					if rng.IntN(3) > 0 {
						ids[k] = id
						p.Identities = append(p.Identities, id)
					}
				}
				slices.SortFunc(p.Overrides, func(a, b StateOverride) int { return int(a.ID - b.ID) })
				prev := snap
				before := decisionOf(prev, reqs[0])
				next, skippedP, ok := snap.Patch(p)
				if !ok {
					t.Fatalf("version %d: Patch refused a patch without trust scores", v)
				}
				want, skippedC := CompileWith(f, state(v), now)
				if len(skippedP) > len(skippedC) {
					t.Errorf("version %d: Patch left out %d entries, CompileWith %d of the whole", v, len(skippedP), len(skippedC))
				}
				if next.Version != want.Version || next.Identities() != want.Identities() {
					t.Fatalf("version %d: patched %s with %d identities, compiled %s with %d", v, next.Version, next.Identities(), want.Version, want.Identities())
				}
				for _, r := range reqs {
					if got, exp := decisionOf(next, r), decisionOf(want, r); got != exp {
						t.Fatalf("version %d, request %+v:\npatched  %s\ncompiled %s\npatch %+v", v, r, got, exp, p)
					}
				}
				if after := decisionOf(prev, reqs[0]); after != before {
					t.Fatalf("version %d: Patch changed the snapshot it patched: %s, then %s", v, before, after)
				}
				snap = next
			}
		})
	}
}

// TestPatchRefusesTrust: an identity with a trust score, added or removed, is compiled whole.
func TestPatchRefusesTrust(t *testing.T) {
	s := mustCompileWith(t, mustFiles(t, controlFiles), nil, now)
	trust := 0.5
	for _, p := range []*StatePatch{
		{Version: 2, Identities: []Identity{{Kind: IdentityUser, Value: "u", Trust: &trust}}},
		{Version: 2, RemovedIdentities: []Identity{{Kind: IdentityUser, Value: "u", Trust: &trust}}},
	} {
		if _, _, ok := s.Patch(p); ok {
			t.Errorf("Patch(%+v) ok", p)
		}
	}
}

// BenchmarkPatch is one ban patched into a snapshot of n overrides and n identity
// assignments, against compiling the whole state again (what a node did at every change).
func BenchmarkPatch(b *testing.B) {
	f := mustFiles(b, controlFiles)
	for _, n := range []int{1000, 10000, 100000} {
		st := bigState(n)
		s := mustCompileWith(b, f, st, now)
		p := &StatePatch{Version: 2, Overrides: []StateOverride{{ID: int64(n + 1), Override: Override{Tenant: "new", Type: OverrideBan, ExpiresAt: now.Add(time.Hour), Source: SourceAPI}}}}
		b.Run(fmt.Sprint("patch/", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, skipped, ok := s.Patch(p); !ok || len(skipped) > 0 {
					b.Fatal(ok, skipped)
				}
			}
		})
		b.Run(fmt.Sprint("compile/", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				CompileWith(f, st, now)
			}
		})
	}
}
