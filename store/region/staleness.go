package region

import (
	"slices"
	"sync"
	"sync/atomic"
)

// staleSamples is how many recent samples a region keeps to judge how stale a peer's counts
// are; staleQuantile is the share of the one-way delays the reservation covers. A high
// quantile of a window rather than a mean: a busy machine's slow calls widen it within a few
// syncs, and one outlier does not hold it wide for long.
const (
	staleSamples  = 32
	staleQuantile = 0.9
	// staleMin is how many samples a quantile waits for; before, the smoothed delay stands in.
	staleMin = 4
)

// staleness follows how old a peer's counts are when they arrive, as observed: the one-way
// delays measured on this region's own Syncs to the peer, and the time each of the peer's
// Syncs spent between its sending (its SentAtUs, when the counts were read) and its arrival
// here. A busy machine reads, sends and receives late: counts that arrive a second after they
// were read reserve for that second, not for the configured interval.
//
// The peer's clock is not this one's, so an arrival's age is taken relative to the fastest of
// the recent ones: offset = arrival - sent is the skew plus the transit; offset minus the
// smallest recent offset is how much later than the fastest this one came, which the skew
// does not change. The age of the newest counts is then the delay plus that excess.
type staleness struct {
	mu      sync.Mutex
	last    int64 // µs, the newest arrival
	offsets ring
	delays  ring

	// delay is the quantile of the measured delays, 0 until staleMin; age is the age the
	// newest counts had when they arrived, beyond the delay. Read on the hot path.
	delay, age atomic.Int64
}

// ring is a fixed window of recent samples (µs).
type ring struct {
	v    [staleSamples]int64
	n, i int
}

func (r *ring) add(v int64) {
	r.v[r.i] = v
	r.i = (r.i + 1) % staleSamples
	r.n = min(r.n+1, staleSamples)
}

// quantile returns the q-quantile of the samples, or 0 with fewer than staleMin.
func (r *ring) quantile(q float64) int64 {
	if r.n < staleMin {
		return 0
	}
	s := slices.Clone(r.v[:r.n])
	slices.Sort(s)
	return s[min(r.n-1, int(q*float64(r.n)))]
}

// least returns the smallest sample; the ring holds one at least.
func (r *ring) least() int64 { return slices.Min(r.v[:r.n]) }

// arrived records a Sync of the peer sent at sent (the peer's clock, µs; 0 when unknown) that
// arrived at at (this region's clock). A message read late from the region's inbox carries
// the time it arrived at the region; an older one than the newest changes nothing.
func (s *staleness) arrived(sent, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at <= s.last {
		return
	}
	s.last = at
	if sent <= 0 {
		return
	}
	off := at - sent
	s.offsets.add(off)
	s.age.Store(max(0, off-s.offsets.least()))
}

// measured records one one-way delay to the peer (µs): half a Sync call's round trip.
func (s *staleness) measured(d int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delays.add(d)
	s.delay.Store(s.delays.quantile(staleQuantile))
}
