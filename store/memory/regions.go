package memory

import (
	"context"

	"github.com/sluicehq/sluice/algorithm"
)

// This file serves the region sync (store.KeyDirectory, store.StateReader) through the two
// functions of the table it relies on, shard.entries and entry.load, so that it does not
// depend on how the table finds a key.

// Keys calls f with every key held that starts with prefix (store.KeyDirectory). One stripe
// is locked at a time, and f runs under its lock: f must not call the store.
func (s *Store) Keys(_ context.Context, prefix []byte, f func(key []byte)) error {
	var buf []byte
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.entries(func(k string, _ *entry) {
			if len(k) >= len(prefix) && k[:len(prefix)] == string(prefix) {
				buf = append(buf[:0], k...)
				f(buf)
			}
		})
		sh.mu.Unlock()
	}
	return nil
}

// ReadStates sets states[i] to the state of keys[i] (store.StateReader): zero for a key not
// held or idle. It walks the stripes that hold the keys once each, so reading every key of a
// stripe costs one walk of it, not one per key.
func (s *Store) ReadStates(_ context.Context, kind algorithm.Kind, keys [][]byte, states []algorithm.State) error {
	now := s.clock()
	want := make(map[int]map[string]int)
	for i, k := range keys {
		states[i] = algorithm.State{}
		n := s.shardOf(k)
		if want[n] == nil {
			want[n] = map[string]int{}
		}
		want[n][string(k)] = i
	}
	found := make([]*entry, len(keys))
	for n, idx := range want {
		sh := &s.shards[n]
		sh.mu.Lock()
		sh.entries(func(k string, e *entry) {
			if i, ok := idx[k]; ok {
				found[i] = e
			}
		})
		sh.mu.Unlock()
	}
	// Entries are locked once their stripe is not: a batch holding an entry may wait for its
	// stripe's lock (see shard), so waiting for an entry under a stripe's lock could deadlock.
	for i, e := range found {
		if e == nil {
			continue
		}
		e.mu.Lock()
		if e.idleAt != removed {
			e.load(kind, now, &states[i])
			states[i].Log = nil
		}
		e.mu.Unlock()
	}
	// Keys listed twice share an index: copy to the others.
	for i, k := range keys {
		if j := want[s.shardOf(k)][string(k)]; j != i {
			states[i] = states[j]
		}
	}
	return nil
}
