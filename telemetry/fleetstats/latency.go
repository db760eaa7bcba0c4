package fleetstats

import (
	"math"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Metric names read from the node's registry (package metrics).
const (
	durationMetric = "sluice_check_duration_seconds"
	breakerMetric  = "sluice_store_breaker_state"
)

// histogram is the decision latency histogram summed over its label values: cumulative counts
// per upper bound, and the total.
type histogram struct {
	bounds []float64
	counts []uint64
	total  uint64
}

// readMetrics finds the latency histogram and the breaker's state in mfs. ok is false when the
// histogram is not registered.
func readMetrics(mfs []*dto.MetricFamily) (h histogram, breaker string, ok bool) {
	for _, mf := range mfs {
		switch mf.GetName() {
		case durationMetric:
			for _, m := range mf.GetMetric() {
				hm := m.GetHistogram()
				if hm == nil {
					continue
				}
				if h.bounds == nil {
					for _, b := range hm.GetBucket() {
						h.bounds = append(h.bounds, b.GetUpperBound())
					}
					h.counts = make([]uint64, len(h.bounds))
				}
				for i, b := range hm.GetBucket() {
					if i < len(h.counts) {
						h.counts[i] += b.GetCumulativeCount()
					}
				}
				h.total += hm.GetSampleCount()
			}
			ok = true
		case breakerMetric:
			for _, m := range mf.GetMetric() {
				switch m.GetGauge().GetValue() {
				case 0:
					breaker = "closed"
				case 1:
					breaker = "half-open"
				default:
					breaker = "open"
				}
			}
		}
	}
	return h, breaker, ok
}

// sub returns the observations of h that came after base (same buckets).
func (h histogram) sub(base histogram) histogram {
	out := histogram{bounds: h.bounds, counts: make([]uint64, len(h.counts)), total: h.total - min(base.total, h.total)}
	for i := range h.counts {
		var b uint64
		if i < len(base.counts) {
			b = base.counts[i]
		}
		out.counts[i] = h.counts[i] - min(b, h.counts[i])
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does: linear
// interpolation inside the bucket that holds it; past the last bound, that bound.
func (h histogram) quantile(q float64) float64 {
	if h.total == 0 || len(h.bounds) == 0 {
		return 0
	}
	rank := q * float64(h.total)
	lower, below := 0.0, uint64(0)
	for i, upper := range h.bounds {
		if float64(h.counts[i]) >= rank {
			in := h.counts[i] - below
			if in == 0 || math.IsInf(upper, 1) {
				return lower
			}
			return lower + (upper-lower)*(rank-float64(below))/float64(in)
		}
		lower, below = upper, h.counts[i]
	}
	return h.bounds[len(h.bounds)-1]
}

// latency keeps the histogram's samples over the rate window, so that its p99 is of the
// decisions of that window, not since the node started.
type latency struct {
	samples []sample
}

type sample struct {
	at time.Time
	h  histogram
}

// push adds a sample and forgets those no longer needed: the newest one at or before the
// window's start stays as the base of the difference.
func (l *latency) push(at time.Time, h histogram, window time.Duration) {
	l.samples = append(l.samples, sample{at, h})
	start := at.Add(-window)
	for len(l.samples) > 2 && !l.samples[1].at.After(start) {
		l.samples = l.samples[1:]
	}
}

// p99 returns the window's 99th percentile in milliseconds and the decisions it is of.
func (l *latency) p99() (ms float64, n int64) {
	if len(l.samples) == 0 {
		return 0, 0
	}
	last := l.samples[len(l.samples)-1].h
	d := last
	if len(l.samples) > 1 {
		d = last.sub(l.samples[0].h)
	}
	return math.Round(d.quantile(0.99)*1e6) / 1e3, int64(d.total)
}
