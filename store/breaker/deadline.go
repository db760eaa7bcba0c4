package breaker

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// An adaptive deadline follows the store's measured latency: Multiplier times the Percentile
// of the calls of the last Window (the 99.9th: on two cores shared with the load, a flush
// stalled by the scheduler every few seconds lay beyond the 99th and failed its 20-50
// coalesced callers open at three times it), never below Options.Timeout nor above Options.MaxTimeout.
// A loaded but healthy store, whose answers slow from 1 ms to 15 ms, then does not fail calls
// at a fixed 10 ms and trip the breaker, while a hung one still fails every call, if only at
// MaxTimeout, and trips it as before. A call that failed at its deadline counts at that
// deadline (all that is known is that it took longer), so the deadline climbs, a Multiplier
// at a time, while calls keep running into it.
const (
	deadlinePercentile = 0.999
	deadlineMultiplier = 3
	deadlineWindow     = 10 * time.Second // in two halves: the last full one and the current
	deadlineEvery      = 100 * time.Millisecond
	// deadlineMinCalls: with fewer calls in the window nothing is known of the store's
	// latency, so the deadline is the ceiling, Options.MaxTimeout: a cold start (connections
	// being made, 50 callers at once on a store not yet warm) took 20-40 ms and failed dozens
	// of calls open at a 10 ms floor before the first recomputation. A hung store fails calls
	// at the ceiling until the breaker opens, as it would once the deadline had climbed.
	deadlineMinCalls = 20
)

// latencyBuckets is a log-linear histogram's size: 4 buckets per power of two of µs, up to
// 2^24 µs (16 s), far past any deadline.
const latencyBuckets = 4 * 24

// deadline is the adaptive deadline of a guard. Recording is a few atomic adds; the deadline
// itself is recomputed at most every deadlineEvery by the caller that notices it is due.
type deadline struct {
	floor, ceiling time.Duration
	now            func() time.Duration // monotonic; injected by tests

	current atomic.Int64 // the deadline in ns
	due     atomic.Int64 // when to recompute, in now's ns

	mu    sync.Mutex // recompute
	half  int64      // the index of the current half window (now / (deadlineWindow/2))
	hists [2]histogram
}

type histogram [latencyBuckets]atomic.Uint64

func newDeadline(floor, ceiling time.Duration, now func() time.Duration) *deadline {
	d := &deadline{floor: floor, ceiling: ceiling, now: now}
	d.current.Store(int64(ceiling))
	t := now()
	d.half = int64(t / (deadlineWindow / 2))
	d.due.Store(int64(t + deadlineEvery))
	return d
}

// get returns the deadline of the next call.
func (d *deadline) get() time.Duration { return time.Duration(d.current.Load()) }

// record counts a call that took took (or failed at its deadline after took), and recomputes
// the deadline when it is due.
func (d *deadline) record(took time.Duration) {
	t := d.now()
	d.hists[(int64(t/(deadlineWindow/2)))&1][bucket(took)].Add(1)
	if int64(t) >= d.due.Load() {
		d.recompute(t)
	}
}

func (d *deadline) recompute(t time.Duration) {
	if !d.mu.TryLock() {
		return // another caller is at it
	}
	defer d.mu.Unlock()
	if int64(t) < d.due.Load() {
		return
	}
	d.due.Store(int64(t + deadlineEvery))
	// Clear the halves the window left behind: the one about to be reused, or both after a
	// silence of a whole window.
	half := int64(t / (deadlineWindow / 2))
	for h := d.half + 1; h <= half && h <= d.half+2; h++ {
		for i := range d.hists[h&1] {
			d.hists[h&1][i].Store(0)
		}
	}
	d.half = half
	var counts [latencyBuckets]uint64
	total := uint64(0)
	for h := range d.hists {
		for i := range counts {
			n := d.hists[h][i].Load()
			counts[i] += n
			total += n
		}
	}
	next := d.ceiling
	if total >= deadlineMinCalls {
		rank := uint64(float64(total)*deadlinePercentile + 0.5)
		seen := uint64(0)
		for i, n := range counts {
			seen += n
			if seen >= rank {
				next = max(d.floor, min(d.ceiling, deadlineMultiplier*upper(i)))
				break
			}
		}
	}
	d.current.Store(int64(next))
}

// bucket is the histogram bucket of a latency.
func bucket(took time.Duration) int {
	us := uint64(max(0, took.Microseconds()))
	if us < 4 {
		return int(us)
	}
	e := bits.Len64(us) - 1 // 2^e <= us < 2^(e+1), e >= 2
	i := 4*(e-1) + int(us>>(e-2)&3)
	return min(i, latencyBuckets-1)
}

// upper is the end of bucket i: a percentile errs long.
func upper(i int) time.Duration {
	if i < 4 {
		return time.Duration(i+1) * time.Microsecond
	}
	e := i/4 + 1
	return time.Duration((4+i%4+1)<<(e-2)) * time.Microsecond
}
