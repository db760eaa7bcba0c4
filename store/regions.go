package store

import (
	"context"

	"github.com/sluicehq/sluice/algorithm"
)

// KeyDirectory lists the keys a store holds, for the region sync (docs/architecture.md,
// Regions), which sends the counts of every key of a global rule. The memory and Redis stores
// implement it.
type KeyDirectory interface {
	// Keys calls f with every key held that starts with prefix, in no order. A key may be
	// reported twice (Redis SCAN does), and one added or removed meanwhile may be missed. f must
	// not keep key past its return.
	Keys(ctx context.Context, prefix []byte, f func(key []byte)) error
}

// StateReader reads keys' state without changing it. The memory and Redis stores implement it.
type StateReader interface {
	// ReadStates sets states[i] to the state of keys[i], of algorithm kind: zero for a key
	// not held or idle. For the window algorithms T is the current window's start (µs), V its
	// count and, for sliding_window_counter, W the previous window's count.
	ReadStates(ctx context.Context, kind algorithm.Kind, keys [][]byte, states []algorithm.State) error
}
