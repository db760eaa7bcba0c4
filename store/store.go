// Package store holds what every Sluice store shares: the batch a request becomes, and the
// rules a store must keep (DESIGN.md, data flow): one atomic step per request, all or nothing.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// Op is one limit of a request as a store applies it.
type Op struct {
	// Key is the bucket key (see internal/key). Keys reach the store in plain text.
	Key    []byte
	Params *algorithm.Params
	// Cost is what the op consumes when the batch is allowed; 0 looks without consuming.
	Cost int64
	// Shadow ops are decided and reported but never deny the batch; a denied shadow op
	// consumes nothing.
	Shadow bool
}

// Batch is the limits of one request, decided at one instant of the store's clock.
type Batch struct {
	Ops []Op
	// IdempotencyKey, when set, makes the store remember the results for IdempotencyTTL and
	// answer a batch with the same key with them, consuming nothing again.
	IdempotencyKey []byte
	IdempotencyTTL time.Duration

	// HotKey is set by a store that decided the batch in the process (hot-key mode) rather
	// than in the shared store.
	HotKey bool
}

// Store applies batches of limits atomically. The memory and Redis stores implement it, and the
// guards (breaker, hotkey) wrap one.
//
// Apply and Reset return by ctx's deadline, whatever the backend is doing (the breaker's
// deadline is only as good as this), and never touch b or results once they returned.
type Store interface {
	// Apply decides every op of b at one instant of the store's clock and consumes all of them
	// only if every non-shadow op is allowed. It fills results[i] for b.Ops[i]; replayed
	// reports an idempotent replay of an earlier batch. An error means the store could not
	// decide; it is never a denial.
	Apply(ctx context.Context, b *Batch, results []algorithm.Result) (replayed bool, err error)
	// Reset drops the state of keys.
	Reset(ctx context.Context, keys [][]byte) error
	// Close releases the store.
	Close() error
}

// ErrUnavailable is wrapped by errors that mean the store could not be reached or did not
// answer in time; callers fall back by each rule's on_store_error.
var ErrUnavailable = errors.New("store unavailable")
