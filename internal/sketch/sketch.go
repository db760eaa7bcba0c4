// Package sketch is the Space-Saving heavy-hitters sketch (Metwally, Agrawal and El Abbadi,
// 2005) with mergeable summaries (Agarwal et al., "Mergeable summaries", 2012): fixed memory
// per sketch, and the summaries of several nodes merge into one of the same bound.
//
// Written here because it is a few dozen lines of core and no well-kept Go package offers it
// without pulling in far more.
package sketch

import (
	"cmp"
	"slices"
	"sync"
)

// SpaceSaving counts keys in k counters: a key not counted takes over the smallest counter and
// inherits its count, so any key seen more than n/k times in n adds holds a counter. Its
// methods are safe for concurrent use.
//
// The counters sit in slots that never move, and a min-heap of slot numbers finds the smallest
// in O(log k), where a scan made a key the sketch does not hold cost in proportion to k
// (BenchmarkAdd; docs/measurements.md). Heap moves swap slot numbers only, so the key index is
// written once per new key, not per move.
type SpaceSaving struct {
	mu     sync.Mutex
	keys   []string
	counts []int64
	errs   []int64 // the count a key inherited when it took its counter: counts-errs is sure
	index  map[string]int32
	heap   []int32 // slot numbers, the smallest count first
	at     []int32 // at[slot] is the slot's place in heap
}

// New returns a sketch of k counters (at least 1).
func New(k int) *SpaceSaving {
	k = max(k, 1)
	return &SpaceSaving{
		keys: make([]string, 0, k), counts: make([]int64, 0, k), errs: make([]int64, 0, k),
		index: make(map[string]int32, k), heap: make([]int32, 0, k), at: make([]int32, 0, k),
	}
}

// Add counts key once.
func (s *SpaceSaving) Add(key []byte) { s.AddN(key, 1) }

// AddN counts key n times (n >= 1).
func (s *SpaceSaving) AddN(key []byte, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The string(key) conversions in map lookups do not allocate; only a key that takes a
	// counter is copied.
	if slot, ok := s.index[string(key)]; ok {
		s.counts[slot] += n
		s.down(int(s.at[slot]))
		return
	}
	if len(s.keys) < cap(s.keys) {
		slot := int32(len(s.keys))
		s.index[string(key)] = slot
		s.keys = append(s.keys, string(key))
		s.counts = append(s.counts, n)
		s.errs = append(s.errs, 0)
		s.heap = append(s.heap, slot)
		s.at = append(s.at, slot)
		s.up(int(slot))
		return
	}
	low := s.heap[0]
	delete(s.index, s.keys[low])
	s.keys[low] = string(key)
	s.index[s.keys[low]] = low
	s.errs[low] = s.counts[low]
	s.counts[low] += n
	s.down(0)
}

// up moves the heap's i-th slot toward the root while its count is below its parent's.
func (s *SpaceSaving) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if s.counts[s.heap[parent]] <= s.counts[s.heap[i]] {
			return
		}
		s.swap(i, parent)
		i = parent
	}
}

// down moves the heap's i-th slot toward the leaves while a child's count is below its own.
func (s *SpaceSaving) down(i int) {
	for {
		low, left := i, 2*i+1
		if left < len(s.heap) && s.counts[s.heap[left]] < s.counts[s.heap[low]] {
			low = left
		}
		if right := left + 1; right < len(s.heap) && s.counts[s.heap[right]] < s.counts[s.heap[low]] {
			low = right
		}
		if low == i {
			return
		}
		s.swap(i, low)
		i = low
	}
}

func (s *SpaceSaving) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.at[s.heap[i]], s.at[s.heap[j]] = int32(i), int32(j)
}

// Drain returns the counters of the keys surely counted at least min times (Count - Err >=
// min), in no order, and empties the sketch.
func (s *SpaceSaving) Drain(min int64) []Counter {
	s.mu.Lock()
	defer s.mu.Unlock()
	var heavy []Counter
	for i, c := range s.counts {
		if c-s.errs[i] >= min {
			heavy = append(heavy, Counter{Key: s.keys[i], Count: c, Err: s.errs[i]})
		}
	}
	s.reset()
	return heavy
}

// Reset empties the sketch.
func (s *SpaceSaving) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
}

func (s *SpaceSaving) reset() {
	s.keys, s.counts, s.errs = s.keys[:0], s.counts[:0], s.errs[:0]
	s.heap, s.at = s.heap[:0], s.at[:0]
	clear(s.index)
}

// Counter is one key of a summary: Count is an upper bound of its true count, Count - Err a
// lower bound.
type Counter struct {
	Key   string `json:"key"`
	Count int64  `json:"count"`
	Err   int64  `json:"error,omitempty"`
}

// Summary is what a sketch knows: its counters, largest first, and whether every counter is
// taken (Full), when a key it does not list may have been seen up to Min times.
type Summary struct {
	Counters []Counter `json:"counters"`
	Full     bool      `json:"full,omitempty"`
}

// Min is the most a key the summary does not list may have been counted: the smallest count
// of a full summary, else 0.
func (m Summary) Min() int64 {
	if !m.Full || len(m.Counters) == 0 {
		return 0
	}
	return m.Counters[len(m.Counters)-1].Count
}

// Summary returns the sketch's counters, largest first.
func (s *SpaceSaving) Summary() Summary {
	s.mu.Lock()
	out := Summary{Counters: make([]Counter, len(s.keys)), Full: len(s.keys) == cap(s.keys)}
	for i, k := range s.keys {
		out.Counters[i] = Counter{Key: k, Count: s.counts[i], Err: s.errs[i]}
	}
	s.mu.Unlock()
	sortCounters(out.Counters)
	return out
}

// Top returns the summary's n largest counters (all when n <= 0) as a summary: still
// mergeable, its Min is the n-th count.
func (m Summary) Top(n int) Summary {
	if n <= 0 || n >= len(m.Counters) {
		return m
	}
	return Summary{Counters: slices.Clone(m.Counters[:n]), Full: true}
}

// Merge combines summaries of disjoint streams (one per node, or per interval) into one of at
// most k counters (all when k <= 0). A key missing from a full summary may have been counted
// there up to its Min: that is added to the key's count and error, so Count stays an upper
// bound and Count - Err a lower bound of the key's true total.
func Merge(k int, parts ...Summary) Summary {
	type acc struct{ count, err int64 }
	sum := map[string]*acc{}
	var order []string
	for _, p := range parts {
		for _, c := range p.Counters {
			a, ok := sum[c.Key]
			if !ok {
				a = &acc{}
				sum[c.Key] = a
				order = append(order, c.Key)
			}
			a.count += c.Count
			a.err += c.Err
		}
	}
	full := false
	for _, p := range parts {
		min := p.Min()
		if p.Full {
			full = true
		}
		if min == 0 {
			continue
		}
		listed := make(map[string]bool, len(p.Counters))
		for _, c := range p.Counters {
			listed[c.Key] = true
		}
		for _, key := range order {
			if !listed[key] {
				sum[key].count += min
				sum[key].err += min
			}
		}
	}
	out := Summary{Counters: make([]Counter, 0, len(order)), Full: full}
	for _, key := range order {
		a := sum[key]
		out.Counters = append(out.Counters, Counter{Key: key, Count: a.count, Err: a.err})
	}
	sortCounters(out.Counters)
	if k > 0 && len(out.Counters) > k {
		out.Counters = out.Counters[:k]
		out.Full = true
	}
	return out
}

// sortCounters orders by count, largest first, then by the surer count, then by key, so that
// equal inputs give equal outputs.
func sortCounters(cs []Counter) {
	slices.SortFunc(cs, func(a, b Counter) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Count-b.Err, a.Count-a.Err); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}
