package algorithm

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// This file measures the sliding window counter against an exact log (issue 28): the most any
// true window (t-P, t] admits and the mean admitted, under steady (Poisson) and bursty traffic
// from 0.5x to 10x the limit, for the two-window estimate it replaced ("old") and the buckets
// ("new"). go test -v -run CounterAccuracy ./algorithm prints the table.

// legacyCounter is the old estimate, as algorithm.go had it (the whole result, so that its cost
// compares): the previous window's count weighted by the share of it still inside the sliding
// window, plus the current window's count. t window start, v current count, w previous count.
type legacyCounter struct{ t, v, w int64 }

func (c *legacyCounter) take(p *Params, now, cost int64, r *Result) bool {
	*r = Result{}
	start := p.window(now)
	if c.t != start {
		if c.t == start-p.Period {
			c.w = c.v
		} else {
			c.w = 0
		}
		c.t, c.v = start, 0
	}
	pt := p.periodTicks
	e := (now - start) / p.tick
	estimate := c.w*(pt-e) + c.v*pt
	bound := p.Limit * pt
	current := c.v
	switch {
	case cost > p.Limit:
		r.Reason = ReasonCostExceedsCapacity
	case estimate+cost*pt <= bound || cost == 0:
		r.Allowed = true
		estimate += cost * pt
		current += cost
	case c.v+cost <= p.Limit:
		need := pt - (p.Limit-c.v-cost)*pt/c.w
		r.RetryAfter = start + need*p.tick - now
	default:
		need := pt - (p.Limit-cost)*pt/c.v
		r.RetryAfter = start + p.Period + need*p.tick - now
	}
	r.Remaining = max(0, bound-estimate) / pt
	switch {
	case current > 0:
		r.ResetAfter = start + 2*p.Period - now
	case c.w > 0:
		r.ResetAfter = start + p.Period - now
	}
	if r.Allowed {
		c.v += cost
	}
	return r.Allowed
}

// arrivals makes the request instants of one scenario over periods windows of p: steady is a
// Poisson stream at x times the limit; bursty puts each window's x·Limit requests (Poisson) in
// its last tenth.
func arrivals(rng *rand.Rand, p Params, x float64, bursty bool, periods int) []int64 {
	var out []int64
	period := float64(p.Period)
	for w := 1; w <= periods; w++ {
		lo, span := float64(w)*period, period
		if bursty {
			lo, span = lo+0.9*period, 0.1*period
		}
		rate := x * float64(p.Limit) / span
		for t := lo + rng.ExpFloat64()/rate; t < lo+span; t += rng.ExpFloat64() / rate {
			out = append(out, base+int64(t))
		}
	}
	return out
}

// windowStats returns the most admitted in any true window (t-P, t] and the count admitted.
func windowStats(period int64, admitted []int64) (worst, total int64) {
	j := 0
	for i, t := range admitted {
		for admitted[j] <= t-period {
			j++
		}
		worst = max(worst, int64(i-j+1))
	}
	return worst, int64(len(admitted))
}

type accuracy struct {
	worstOld, worstNew int64   // the most in a true window
	meanOld, meanNew   float64 // admitted, relative to the exact log's, -1..
}

// measureAccuracy runs the three limiters on the same requests (cost 1).
func measureAccuracy(t testing.TB, x float64, bursty bool, seed uint64, periods int) accuracy {
	p := mustParams(t, SlidingWindowCounter, 100, 0, 2*time.Second)
	exact := p
	exact.Kind = SlidingWindowLog
	var sNew, sLog State
	var old legacyCounter
	var aOld, aNew, aLog []int64
	var r Result
	for _, now := range arrivals(rand.New(rand.NewPCG(seed, 28)), p, x, bursty, periods) {
		if old.take(&p, now, 1, &r) {
			aOld = append(aOld, now)
		}
		if Take(&p, &sNew, now, 1, &r); r.Allowed {
			aNew = append(aNew, now)
		}
		if Take(&exact, &sLog, now, 1, &r); r.Allowed {
			aLog = append(aLog, now)
		}
	}
	var a accuracy
	var nOld, nNew, nLog int64
	a.worstOld, nOld = windowStats(p.Period, aOld)
	a.worstNew, nNew = windowStats(p.Period, aNew)
	_, nLog = windowStats(p.Period, aLog)
	a.meanOld = float64(nOld)/float64(nLog) - 1
	a.meanNew = float64(nNew)/float64(nLog) - 1
	return a
}

// TestCounterAccuracy checks the goal of issue 28 on fixed seeds, limit 100 per 2 s: in every
// true window at most 105 admitted, and the mean admitted within 1% of the exact log's, steady
// or bursty, 0.5x to 10x. The bound on the worst window holds by construction (the estimate
// errs by less than a bucket, 5); the mean is measured, with room.
func TestCounterAccuracy(t *testing.T) {
	t.Parallel()
	periods := 150
	if testing.Short() {
		periods = 40
	}
	t.Logf("%-7s %5s | %9s %9s | %9s %9s", "traffic", "rate", "worst old", "worst new", "mean old", "mean new")
	for _, bursty := range []bool{false, true} {
		for _, x := range []float64{0.5, 1, 2, 3, 5, 10} {
			name := fmt.Sprintf("steady %gx", x)
			if bursty {
				name = fmt.Sprintf("bursty %gx", x)
			}
			var worst accuracy
			for seed := uint64(1); seed <= 2; seed++ {
				a := measureAccuracy(t, x, bursty, seed, periods)
				worst.worstOld, worst.worstNew = max(worst.worstOld, a.worstOld), max(worst.worstNew, a.worstNew)
				if abs(a.meanOld) > abs(worst.meanOld) {
					worst.meanOld = a.meanOld
				}
				if abs(a.meanNew) > abs(worst.meanNew) {
					worst.meanNew = a.meanNew
				}
			}
			kind, rate, _ := strings.Cut(name, " ")
			t.Logf("%-7s %5s | %9d %9d | %+8.2f%% %+8.2f%%", kind, rate, worst.worstOld, worst.worstNew, 100*worst.meanOld, 100*worst.meanNew)
			if worst.worstNew > 105 || abs(worst.meanNew) > 0.01 {
				t.Errorf("%s: worst true window %d (want <= 105), mean admitted %+.2f%% of the exact log's (want within 1%%)",
					name, worst.worstNew, 100*worst.meanNew)
			}
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// BenchmarkCounterEstimate is the CPU of one decision (with its commit when allowed) of the old
// estimate and the buckets, on steady traffic at 3x a limit of 100 per 2 s: the buckets' state
// is at its usual size, about 20 of them.
func BenchmarkCounterEstimate(b *testing.B) {
	p := mustParams(b, SlidingWindowCounter, 100, 0, 2*time.Second)
	reqs := arrivals(rand.New(rand.NewPCG(1, 28)), p, 3, false, 200)
	b.Run("old", func(b *testing.B) {
		var c legacyCounter
		var r Result
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			c.take(&p, reqs[i%len(reqs)]+int64(i/len(reqs))*201*p.Period, 1, &r)
			i++
		}
	})
	b.Run("new", func(b *testing.B) {
		var s State
		var r Result
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			Take(&p, &s, reqs[i%len(reqs)]+int64(i/len(reqs))*201*p.Period, 1, &r)
			i++
		}
	})
}
