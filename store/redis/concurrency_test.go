package redis

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// slotLimits are the concurrency keys of the differential test (limits 1, 3 and 5; two of a
// caller, one global, so that on a Cluster a batch crosses slots) and, beside them, a few rate
// limits that share reservations with them.
func slotLimits(t *testing.T) (slots, rates []limit) {
	for i, n := range []int64{1, 3, 5} {
		p, err := algorithm.NewParams(algorithm.Concurrency, n, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		k := key.AppendHead(nil, fmt.Sprintf("jobs%d", i), "v1")
		if i < 2 {
			k = key.AppendTag(k, 'u', fmt.Sprint("user", i))
		}
		slots = append(slots, limit{key: k, params: p})
	}
	for _, l := range limits(t) {
		if l.params.Kind == algorithm.TokenBucket || l.params.Kind == algorithm.SlidingWindowLog {
			rates = append(rates, l)
		}
	}
	return slots, rates
}

// differentialSlots sends the same random reservations (taking slots), checks (asking only),
// releases, renewals and looks through the memory store and st at the same instants, and
// requires identical results: the sorted set in Redis decides as algorithm's slots do,
// expiry included.
func differentialSlots(t *testing.T, st *Store, c *clock, steps int, seed uint64) {
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(seed, 7))
	slots, rates := slotLimits(t)
	type held struct {
		ops []store.Op
		at  []int64
	}
	var open []held
	taken, full, released, renewed := 0, 0, 0, 0
	same := func(step int, what string, b *store.Batch, got, want []algorithm.Result) {
		t.Helper()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("step %d %s op %d (%s limit %d): redis %+v, memory %+v", step, what, i, b.Ops[i].Params.Kind, b.Ops[i].Params.Limit, got[i], want[i])
			}
		}
	}
	apply := func(step int, what string, b *store.Batch) []algorithm.Result {
		t.Helper()
		want, got := make([]algorithm.Result, len(b.Ops)), make([]algorithm.Result, len(b.Ops))
		b.OpAt = make([]int64, len(b.Ops))
		if _, err := mem.Apply(ctx, b, want); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Apply(ctx, b, got); err != nil {
			t.Fatalf("step %d %s: %v", step, what, err)
		}
		same(step, what, b, got, want)
		return got
	}
	look := func(step int) {
		for i := range slots {
			b := store.Batch{Ops: []store.Op{{Key: slots[i].key, Params: &slots[i].params}}}
			apply(step, "look", &b)
		}
	}
	for step := range steps {
		switch {
		case rng.IntN(8) == 0 && len(open) > 0:
			// To the instant a held slot returns by itself: it must not count from there.
			h := open[rng.IntN(len(open))]
			for i, op := range h.ops {
				if exp := h.at[i] + op.SlotTTL; op.Slot != nil && exp > c.Now() {
					c.us.Store(exp)
					break
				}
			}
		case rng.IntN(6) == 0:
			c.us.Add(rng.Int64N(1_500_000)) // past some leases' ttl
		default:
			c.us.Add(rng.Int64N(20_000))
		}
		switch k := rng.IntN(10); {
		case k < 5: // a reservation: a slot of one or two concurrency limits, and a rate
			id := fmt.Sprintf("ls_%d_%d", seed, step)
			ttl := 10_000 + rng.Int64N(2_000_000)
			var b store.Batch
			for _, i := range rng.Perm(len(slots))[:1+rng.IntN(2)] {
				b.Ops = append(b.Ops, store.Op{Key: slots[i].key, Params: &slots[i].params, Cost: 1, Slot: []byte(id), SlotTTL: ttl})
			}
			if rng.IntN(2) == 0 {
				r := &rates[rng.IntN(len(rates))]
				b.Ops = append(b.Ops, store.Op{Key: r.key, Params: &r.params, Cost: 1 + rng.Int64N(3)})
			}
			b.Lease = true
			res := apply(step, "reserve", &b)
			allowed := true
			for i := range res {
				allowed = allowed && res[i].Allowed
				if !res[i].Allowed && b.Ops[i].Params.Kind == algorithm.Concurrency {
					full++
				}
			}
			if allowed {
				taken++
				open = append(open, held{ops: b.Ops, at: b.OpAt})
			}
		case k < 7 && len(open) > 0: // settle a lease: free its slots, or renew them
			j := rng.IntN(len(open))
			h := open[j]
			var ops []store.Op
			var at []int64
			renew := rng.IntN(3) == 0
			for i, op := range h.ops {
				if op.Params.Kind != algorithm.Concurrency {
					continue
				}
				op.SlotTTL = 0
				if renew {
					op.SlotTTL = 10_000 + rng.Int64N(2_000_000)
				}
				ops, at = append(ops, op), append(at, h.at[i])
			}
			if renew {
				renewed++
			} else {
				released++
				open = append(open[:j], open[j+1:]...)
			}
			if err := mem.Adjust(ctx, ops, at); err != nil {
				t.Fatal(err)
			}
			if err := st.Adjust(ctx, ops, at); err != nil {
				t.Fatalf("step %d: settle: %v", step, err)
			}
			look(step)
		default: // a check asks whether a slot is free and takes none
			i := rng.IntN(len(slots))
			b := store.Batch{Ops: []store.Op{{Key: slots[i].key, Params: &slots[i].params, Cost: 1}}}
			apply(step, "check", &b)
		}
	}
	if taken < steps/10 || full == 0 || released == 0 || renewed == 0 {
		t.Fatalf("untested: %d taken, %d refused full, %d released, %d renewed", taken, full, released, renewed)
	}
	t.Logf("%d steps: %d slots taken, %d refused full, %d released, %d renewed", steps, taken, full, released, renewed)
}

func TestSlotsMatchMemory(t *testing.T) {
	t.Parallel()
	eachScriptMode(t, func(t *testing.T, st *Store, c *clock) {
		differentialSlots(t, st, c, 1500, 5)
	})
}

// TestSlotsCluster takes slots across a 3-node Cluster's hash slots: a reservation one slot
// denies gives back what another took (refund.lua frees the lease's slot).
func TestSlotsCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := newClock()
	differentialSlots(t, connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), c), c, 800, 6)
}
