package algorithm

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var periods = []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 3700 * time.Millisecond, time.Minute, time.Hour, 24 * time.Hour}

type request struct{ at, cost int64 }

// traffic makes n requests with gaps around the limit's emission interval, so that buckets
// fill, drain and refill, and costs from 0 to a little over the burst.
func traffic(rng *rand.Rand, p Params, n int) []request {
	interval := max(1, p.Period/max(p.Limit, 1))
	now := base + rng.Int64N(p.Period)
	reqs := make([]request, n)
	for i := range reqs {
		switch rng.IntN(10) {
		case 0:
			now += rng.Int64N(3 * p.Period) // long idle
		case 1, 2:
			// same instant
		default:
			now += rng.Int64N(3 * interval)
		}
		cost := rng.Int64N(6)
		if rng.IntN(50) == 0 {
			cost = p.Capacity() + 1
		}
		reqs[i] = request{now, cost}
	}
	return reqs
}

func randomParams(t *testing.T, rng *rand.Rand, k Kind) Params {
	n := 1 + rng.Int64N(50)
	b := int64(0)
	if k.IsBucket() && rng.IntN(2) == 0 {
		b = 1 + rng.Int64N(100)
	}
	return mustParams(t, k, n, b, periods[rng.IntN(len(periods))])
}

// TestBucketEncodingsAgree is the property of docs/architecture.md, Buckets: token_bucket, gcra and leaky_bucket are one
// limiter in three encodings, so the same traffic gets the same decisions.
func TestBucketEncodingsAgree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		tb := randomParams(t, rng, TokenBucket)
		gc, lb := tb, tb
		gc.Kind, lb.Kind = GCRA, LeakyBucket
		var sTB, sGC, sLB State
		for i, r := range traffic(rng, tb, 200) {
			a := Decide(&tb, &sTB, r.at, r.cost)
			b := Decide(&gc, &sGC, r.at, r.cost)
			c := Decide(&lb, &sLB, r.at, r.cost)
			c.Delay = 0
			if a != b || a != c {
				t.Fatalf("trial %d (%d per %dµs, burst %d) request %d %+v:\n token_bucket %+v\n gcra         %+v\n leaky_bucket %+v",
					trial, tb.Limit, tb.Period, tb.Burst, i, r, a, b, c)
			}
			if a.Allowed && r.cost > 0 {
				Commit(&tb, &sTB, r.at, r.cost)
				Commit(&gc, &sGC, r.at, r.cost)
				Commit(&lb, &sLB, r.at, r.cost)
			}
		}
	}
}

// TestExactBounds checks that no algorithm but the sliding window counter ever admits more
// than its bound: B + rate·t over any interval t for the buckets, N per window for the fixed
// window, N in any (t-P, t] for the log, and for the sliding window counter N plus less than
// a bucket (Limit/CounterBuckets) in any (t-P, t]. It also checks that retry_after is honest: the same
// request retried exactly then is allowed.
func TestExactBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, k := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		for trial := range 60 {
			p := randomParams(t, rng, k)
			var s State
			var admitted []request
			for _, r := range traffic(rng, p, 300) {
				res := Decide(&p, &s, r.at, r.cost)
				if res.Allowed && r.cost > 0 {
					Commit(&p, &s, r.at, r.cost)
					admitted = append(admitted, r)
				}
				if !res.Allowed && res.RetryAfter > 0 {
					probe := clone(s)
					if again := Decide(&p, &probe, r.at+res.RetryAfter, r.cost); !again.Allowed {
						t.Fatalf("%s trial %d: denied at %d with retry_after %d, still denied then: %+v", k, trial, r.at, res.RetryAfter, again)
					}
					if res.RetryAfter > p.tick {
						probe = clone(s)
						if early := Decide(&p, &probe, r.at+res.RetryAfter-p.tick, r.cost); early.Allowed {
							t.Fatalf("%s trial %d: retry_after %d is longer than needed", k, trial, res.RetryAfter)
						}
					}
				}
			}
			checkBound(t, k, p, admitted)
		}
	}
}

// clone copies s deeply, so probing it leaves s as it was.
func clone(s State) State {
	if s.Log != nil {
		s.Log = &Log{Entries: append([]Entry(nil), s.Log.Entries...), Buckets: append([]Bucket(nil), s.Log.Buckets...), TickExp: s.Log.TickExp}
	}
	return s
}

func checkBound(t *testing.T, k Kind, p Params, admitted []request) {
	t.Helper()
	for i := range admitted {
		var sum int64
		for j := i; j < len(admitted); j++ {
			sum += admitted[j].cost
			span := admitted[j].at - admitted[i].at
			var bound int64
			switch k {
			case TokenBucket, GCRA, LeakyBucket:
				// Tokens refill per whole tick, so count the span in ticks, rounded up.
				bound = p.Burst + (ceilDiv(span, p.tick)*p.tick*p.Limit)/p.Period
			case SlidingWindowLog:
				if span >= p.Period {
					continue
				}
				bound = p.Limit
			case SlidingWindowCounter:
				if span >= p.Period {
					continue
				}
				// Only the oldest bucket is estimated, and one of its units is surely in.
				bound = p.Limit + p.bucketCap() - 1
			case FixedWindow:
				if p.window(admitted[i].at) != p.window(admitted[j].at) {
					continue
				}
				bound = p.Limit
			}
			if sum > bound {
				t.Fatalf("%s %d per %dµs burst %d: admitted %d in %dµs, bound %d", k, p.Limit, p.Period, p.Burst, sum, span, bound)
			}
		}
	}
}

// TestSlidingCounterError measures how far the sliding window counter strays from the exact
// log on the same traffic: the share of decisions that differ, and the worst excess admitted
// in any true sliding window, as a share of the limit. The traffic runs at the limit on
// average; the test reports the figures (go test -v -run SlidingCounterError) and holds the
// excess to the bound of the buckets, 5% of the limit (TestCounterAccuracy has the rest).
func TestSlidingCounterError(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	var decisions, differ int
	worstExcess := 0.0
	for range 200 {
		swc := mustParams(t, SlidingWindowCounter, 100, 0, time.Second)
		swl := swc
		swl.Kind = SlidingWindowLog
		var sc, sl State
		var admitted []request
		now := base
		for range 2000 {
			now += rng.Int64N(2 * swc.Period / swc.Limit)
			rc := Decide(&swc, &sc, now, 1)
			rl := Decide(&swl, &sl, now, 1)
			decisions++
			if rc.Allowed != rl.Allowed {
				differ++
			}
			if rc.Allowed {
				Commit(&swc, &sc, now, 1)
				admitted = append(admitted, request{now, 1})
			}
			if rl.Allowed {
				Commit(&swl, &sl, now, 1)
			}
		}
		// Worst count in any true sliding window over what the counter admitted.
		j := 0
		for i := range admitted {
			for admitted[i].at-admitted[j].at >= swc.Period {
				j++
			}
			if excess := float64(i-j+1-int(swc.Limit)) / float64(swc.Limit); excess > worstExcess {
				worstExcess = excess
			}
		}
	}
	share := float64(differ) / float64(decisions)
	t.Logf("sliding_window_counter vs sliding_window_log: %.3f%% of %d decisions differ; worst excess in a true window %.1f%% of the limit",
		100*share, decisions, 100*worstExcess)
	if share > 0.10 || worstExcess > 0.05 {
		t.Errorf("sliding window counter strays too far: %.3f%% decisions differ, excess %.1f%%", 100*share, 100*worstExcess)
	}
}

// TestTakeIsDecideThenCommit checks the fused path against the two steps it replaces: the same
// results, the same state and the same idle instant, for every algorithm on random traffic.
func TestTakeIsDecideThenCommit(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, k := range Kinds {
		for trial := range 100 {
			p := randomParams(t, rng, k)
			var fused, stepwise State
			for i, r := range traffic(rng, p, 200) {
				var got Result
				idle, committed := Take(&p, &fused, r.at, r.cost, &got)
				want := Decide(&p, &stepwise, r.at, r.cost)
				wantIdle, wantCommitted := int64(0), want.Allowed && r.cost > 0
				if wantCommitted {
					wantIdle = Commit(&p, &stepwise, r.at, r.cost)
				}
				if got != want || idle != wantIdle || committed != wantCommitted || !sameState(fused, stepwise) {
					t.Fatalf("%s trial %d (%d per %dµs, burst %d) request %d %+v:\n Take          %+v idle %d committed %v state %+v\n Decide+Commit %+v idle %d committed %v state %+v",
						k, trial, p.Limit, p.Period, p.Burst, i, r, got, idle, committed, fused, want, wantIdle, wantCommitted, stepwise)
				}
			}
		}
	}
}

func sameState(a, b State) bool {
	if a.T != b.T || a.V != b.V || a.W != b.W || (a.Log == nil) != (b.Log == nil) {
		return false
	}
	return a.Log == nil || slices.Equal(a.Log.Entries, b.Log.Entries) && slices.Equal(a.Log.Buckets, b.Log.Buckets) && a.Log.TickExp == b.Log.TickExp
}
