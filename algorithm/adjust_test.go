package algorithm

import (
	"math/rand/v2"
	"testing"
)

// TestAdjustMatchesSmallerCost is the give-back's property against a model: a reservation of
// c at t0 settled at t1 for u <= c leaves the limit deciding exactly as if u had been taken at
// t0 (the model: the same algorithm, asked for the true cost), for every algorithm but the
// sliding window counter, whose buckets close by count and so may split differently: for it
// the units inside the window must agree instead. Traffic before the reservation and after
// the settlement is the same for both.
func TestAdjustMatchesSmallerCost(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(28, 5))
	for _, k := range Kinds {
		for trial := range 150 {
			p := randomParams(t, rng, k)
			reqs := traffic(rng, p, 80)
			split := 10 + rng.IntN(40)
			run := func(reserve, used int64) (*State, []Result, bool) {
				var s State
				for _, r := range reqs[:split] {
					var res Result
					Take(&p, &s, r.at, r.cost, &res)
				}
				t0 := reqs[split].at
				if !Decide(&p, &s, t0, reserve).Allowed {
					return nil, nil, false
				}
				if reserve > 0 {
					Commit(&p, &s, t0, reserve)
				}
				t1 := t0 + rng.Int64N(p.Period)
				if reserve != used {
					Adjust(&p, &s, t1, t0, reserve-used)
				}
				var out []Result
				for _, r := range reqs[split+1:] {
					at := max(r.at, t1) + (r.at - reqs[split].at)
					var res Result
					Take(&p, &s, at, r.cost, &res)
					out = append(out, res)
				}
				return &s, out, true
			}
			c := 1 + rng.Int64N(p.Capacity())
			u := rng.Int64N(c + 1)
			seed := rng.Uint64()
			rng = rand.New(rand.NewPCG(seed, 1))
			sa, got, ok := run(c, u)
			if !ok {
				continue
			}
			rng = rand.New(rand.NewPCG(seed, 1))
			sb, want, _ := run(u, u)
			if k == SlidingWindowCounter {
				if sa.Log != nil && sb.Log != nil && sum(sa.Log.Buckets) != sum(sb.Log.Buckets) {
					t.Fatalf("%s trial %d: reserve %d settle %d: %d units in the buckets, the model %d", k, trial, c, u, sum(sa.Log.Buckets), sum(sb.Log.Buckets))
				}
				continue
			}
			for i := range got {
				got[i].Delay, want[i].Delay = 0, 0
				if got[i] != want[i] {
					t.Fatalf("%s trial %d (%d per %dµs, burst %d): reserve %d settle %d: request %d after:\n got   %+v\n model %+v",
						k, trial, p.Limit, p.Period, p.Burst, c, u, i, got[i], want[i])
				}
			}
		}
	}
}

func sum(bs []Bucket) int64 {
	var n int64
	for _, b := range bs {
		n += b.Count
	}
	return n
}

// TestAdjustTakesExcess checks that a settlement past the reservation takes the excess even
// past the limit, so the next request waits, and that a give-back never fills a limit past
// full.
func TestAdjustTakesExcess(t *testing.T) {
	t.Parallel()
	const now = base
	for _, k := range Kinds {
		t.Run(k.String(), func(t *testing.T) {
			p := mustParams(t, k, 10, 0, 1_000_000)
			var s State
			var r Result
			if _, ok := Take(&p, &s, now, 10, &r); !ok {
				t.Fatalf("reserve 10 of 10: %+v", r)
			}
			if _, changed := Adjust(&p, &s, now+1, now, -5); !changed {
				t.Fatal("taking 5 more changed nothing")
			}
			if r := Decide(&p, &s, now+2, 1); r.Allowed || r.Remaining != 0 {
				t.Fatalf("after using 15 of 10: %+v, want a denial", r)
			}
			// Giving back more than was taken leaves the limit full, never fuller.
			var fresh State
			Take(&p, &fresh, now, 1, &r)
			Adjust(&p, &fresh, now, now, 1000)
			if r := Decide(&p, &fresh, now, 0); r.Remaining != 10 {
				t.Fatalf("gave back 1000 of 1: remaining %d, want 10", r.Remaining)
			}
		})
	}
}
