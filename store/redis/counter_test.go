package redis

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// TestCounterBucketsAsMemory drives sliding_window_counter limits whose buckets hold several
// units (100 per 2 s: 5 a bucket; 1000 per minute, tick 1 µs; 7 per 1 s: 1; and 10^8 per
// minute, tick 100 µs, on the key of 100 per 2 s, so that each converts the other's buckets)
// with bursts that fill them, through the memory store and Redis at the same instants: the
// estimate of the cut bucket, retry_after, the merge of buckets, the tick conversion and the
// undo of a batch that a sibling denies must come out the same.
func TestCounterBucketsAsMemory(t *testing.T) {
	t.Parallel()
	eachScriptMode(t, func(t *testing.T, st *Store, c *clock) {
		mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
		defer mem.Close()
		var ls []limit
		for i, spec := range []struct {
			n      int64
			period time.Duration
		}{{100, 2 * time.Second}, {1000, time.Minute}, {7, time.Second}, {100_000_000, time.Minute}} {
			p, err := algorithm.NewParams(algorithm.SlidingWindowCounter, spec.n, 0, spec.period)
			if err != nil {
				t.Fatal(err)
			}
			// The last limit counts in ticks of 100 µs, on the key of the first (1 µs).
			ls = append(ls, limit{key: key.AppendTag(key.AppendHead(nil, fmt.Sprint("swc", i%3), "v1"), 'u', "ann"), params: p})
		}
		if tick, _, _, _, _, _ := ls[3].params.Derived(); tick != 100 {
			t.Fatalf("the coarse limit counts in ticks of %d µs, want 100", tick)
		}
		rng := rand.New(rand.NewPCG(28, 1))
		denied := 0 // of the limit of 100: its buckets fill and the cut one is estimated
		for step := range 4000 {
			if rng.IntN(200) == 0 {
				c.us.Add(rng.Int64N(2_000_000)) // a pause, then a burst
			} else {
				c.us.Add(rng.Int64N(1_500))
			}
			var b store.Batch
			for range 1 + rng.IntN(2) {
				l := &ls[rng.IntN(len(ls))]
				b.Ops = append(b.Ops, store.Op{Key: l.key, Params: &l.params, Cost: rng.Int64N(4)})
			}
			want := make([]algorithm.Result, len(b.Ops))
			got := make([]algorithm.Result, len(b.Ops))
			if _, err := mem.Apply(ctx, &b, want); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Apply(ctx, &b, got); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if !want[i].Allowed && b.Ops[i].Params.Limit == 100 {
					denied++
				}
				if got[i] != want[i] {
					op := b.Ops[i]
					t.Fatalf("step %d op %d (%d per %dµs, cost %d):\n redis  %+v\n memory %+v",
						step, i, op.Params.Limit, op.Params.Period, op.Cost, got[i], want[i])
				}
			}
		}
		if denied < 100 {
			t.Fatalf("the limit of 100 denied %d times: its estimate was barely tested", denied)
		}
	})
}
