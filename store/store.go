// Package store holds what every Sluice store shares: the batch a request becomes, and the
// rules a store must keep (DESIGN.md, data flow): one atomic step per request, all or nothing.
package store

import (
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

// ErrUnavailable is wrapped by errors that mean the store could not be reached or did not
// answer in time; callers fall back by each rule's on_store_error.
var ErrUnavailable = errors.New("store unavailable")
