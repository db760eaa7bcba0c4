package hotkey

import "sync"

// spaceSaving is the Space-Saving heavy-hitter sketch (Metwally et al.): k counters; a key
// not counted takes over the smallest counter and inherits its count, so any key seen more
// than n/k times in n adds is among the counters. Written here because it is twenty lines of
// core and no well-kept Go package offers it without pulling in far more.
type spaceSaving struct {
	mu     sync.Mutex
	keys   []string
	counts []int64
	errs   []int64 // the count a key inherited when it took its counter: counts-errs is sure
	index  map[string]int
}

func newSpaceSaving(k int) *spaceSaving {
	return &spaceSaving{keys: make([]string, 0, k), counts: make([]int64, 0, k), errs: make([]int64, 0, k), index: make(map[string]int, k)}
}

func (s *spaceSaving) add(key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[string(key)]; ok {
		s.counts[i]++
		return
	}
	if len(s.keys) < cap(s.keys) {
		s.index[string(key)] = len(s.keys)
		s.keys = append(s.keys, string(key))
		s.counts = append(s.counts, 1)
		s.errs = append(s.errs, 0)
		return
	}
	low := 0
	for i, c := range s.counts {
		if c < s.counts[low] {
			low = i
		}
	}
	delete(s.index, s.keys[low])
	s.keys[low] = string(key)
	s.index[s.keys[low]] = low
	s.errs[low] = s.counts[low]
	s.counts[low]++
}

// drain returns the keys surely counted at least min times and starts a new interval.
func (s *spaceSaving) drain(min int64) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var heavy []string
	for i, c := range s.counts {
		if c-s.errs[i] >= min {
			heavy = append(heavy, s.keys[i])
		}
	}
	s.keys, s.counts, s.errs = s.keys[:0], s.counts[:0], s.errs[:0]
	clear(s.index)
	return heavy
}
