// Package store holds what every Sluice store shares: the batch a request becomes, and the
// rules a store must keep (docs/architecture.md, Rules of the hot path): one atomic step per request, all or nothing.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// ErrorMode says what a limit decides when its store cannot be reached: a rule's or an Envoy
// limit's on_store_error. The Limiter applies it to the ops of a batch the store failed.
type ErrorMode uint8

// The on_store_error modes.
const (
	FailOpen   ErrorMode = iota // allow, marked degraded
	FailClosed                  // deny
	FailLocal                   // decide with an in-process limiter of the same parameters
)

// String returns the mode as a policy file writes it.
func (m ErrorMode) String() string {
	switch m {
	case FailClosed:
		return "closed"
	case FailLocal:
		return "local"
	}
	return "open"
}

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
	// Counter ops count requests rather than limit them (escalation's burst counters;
	// docs/architecture.md, Escalation and adaptive limits): like shadow ops they never deny
	// the batch, but what one allows it consumes whatever the other ops decide, so a denied
	// request is counted too. A counter op's key is its own: no other op of the batch names it.
	Counter bool
	// Slot, on a concurrency op (algorithm.Concurrency), names the lease whose slot it
	// takes when allowed (Apply: until SlotTTL µs from the store's now), renews to SlotTTL
	// from now (Leaser.Adjust with SlotTTL > 0) or frees (Adjust with SlotTTL 0). A
	// concurrency op without one only asks whether a slot is free (a check, a quota look).
	Slot    []byte
	SlotTTL int64
}

// Binding reports whether op's denial denies its batch: it is neither a shadow nor a counter.
func (op *Op) Binding() bool { return !op.Shadow && !op.Counter }

// Batch is the limits of one request, decided at one instant of the store's clock.
type Batch struct {
	Ops []Op
	// IdempotencyKey, when set, makes the store remember the results of an allowed batch for
	// IdempotencyTTL, bound to IdempotencyFingerprint, and answer a batch with the same key
	// and fingerprint with them, consuming nothing again. A batch with the same key and
	// another fingerprint fails with ErrIdempotencyMismatch. A denied batch leaves no record:
	// its retry is decided afresh.
	IdempotencyKey         []byte
	IdempotencyTTL         time.Duration
	IdempotencyFingerprint Fingerprint

	// HotKey is set by a store that decided the batch in the process (hot-key mode) rather
	// than in the shared store.
	HotKey bool
	// Lease asks the store to decide the batch where a reservation's settlement can reach it
	// later (Leaser.Adjust): in the shared store, never in hot-key mode.
	Lease bool
	// OpAt, when the caller gives it the length of Ops, is filled by the store with the
	// instant (µs, its clock) it decided each op at: what a reservation's settlement names
	// to find the window or log entry it consumed from (on a Redis Cluster each slot decides
	// at its own node's time; a fixed window that Redis's plain commands counted reports the
	// TIME read just before the counts, an instant of the window they went to).
	OpAt []int64
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
	// decide, except ErrIdempotencyMismatch, which refuses the batch; it is never a denial.
	Apply(ctx context.Context, b *Batch, results []algorithm.Result) (replayed bool, err error)
	// Reset drops the state of keys.
	Reset(ctx context.Context, keys [][]byte) error
	// Close releases the store.
	Close() error
}

// ErrIdempotencyMismatch is returned by Apply when the batch's idempotency key holds the record
// of a batch with another fingerprint: the key was reused for a different request. The batch
// consumes nothing. It is the caller's mistake, not the store's: never a reason to fail open or
// to count against the store.
var ErrIdempotencyMismatch = errors.New("idempotency_key: already used, within its TTL, by a request with other limits or another cost")

// Fingerprint identifies what a batch asks of the store, so that an idempotency key replays
// only the request it was first used for.
type Fingerprint [16]byte

// fingerprintVersion starts what is hashed: records live in Redis and in snapshots, so a change
// to the encoding below must change it.
const fingerprintVersion = "sluice-idem-v1"

// FingerprintOf returns the fingerprint of ops: each op's key, effective parameters
// (algorithm, limit, burst, period), cost and shadow and counter flags, in order. It is stable across
// processes, nodes and restarts (the records it binds live in Redis and in snapshots). scratch
// is returned grown, for reuse: a caller that keeps it hashes without allocating.
//
// SHA-256 truncated to 128 bits rather than a faster 64-bit hash: clients choose the attribute
// values that make the keys, and a 64-bit hash's collisions are within a birthday search's
// reach (2^32 tries), which would let an expensive request replay a cheap one's decision.
func FingerprintOf(ops []Op, scratch []byte) (Fingerprint, []byte) {
	buf := append(scratch[:0], fingerprintVersion...)
	buf = binary.AppendUvarint(buf, uint64(len(ops)))
	for i := range ops {
		op := &ops[i]
		buf = binary.AppendUvarint(buf, uint64(len(op.Key)))
		buf = append(buf, op.Key...)
		shadow := byte(0)
		if op.Shadow {
			shadow = 1
		}
		if op.Counter {
			shadow |= 2
		}
		buf = append(buf, byte(op.Params.Kind), shadow)
		buf = binary.AppendVarint(buf, op.Params.Limit)
		buf = binary.AppendVarint(buf, op.Params.Burst)
		buf = binary.AppendVarint(buf, op.Params.Period)
		buf = binary.AppendVarint(buf, op.Cost)
	}
	sum := sha256.Sum256(buf)
	return Fingerprint(sum[:16]), buf
}

// ErrUnavailable is wrapped by errors that mean the store could not be reached or did not
// answer in time; callers fall back by each rule's on_store_error.
var ErrUnavailable = errors.New("store unavailable")

// Pinger is a store that can tell whether it answers: the Redis store, and the decorators over
// a shared store (breaker, hot keys, regions), which ask the store they wrap.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ping asks st whether it answers, if it can be asked; a store without Ping (one in this
// process) always answers.
func Ping(ctx context.Context, st Store) error {
	if p, ok := st.(Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// SetAt fills OpAt, when the caller asked for it, with now: a store that decides every op at
// one instant.
func (b *Batch) SetAt(now int64) {
	if len(b.OpAt) == len(b.Ops) {
		for i := range b.OpAt {
			b.OpAt[i] = now
		}
	}
}

// Leaser is a store that keeps reservations' leases and settles them (DESIGN.md, Work of
// unknown cost): the memory and Redis stores, and the decorators over one. A lease record is
// the caller's opaque bytes; the store keeps it, settles it at most once, and gives back or
// takes more on the limits the reservation consumed from.
type Leaser interface {
	// PutLease keeps rec under id until ttl has passed. An id is the caller's to make
	// unguessable; a second PutLease of one id replaces the record.
	PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error
	// SettleLease settles the lease id with used, once, atomically: the first call returns
	// its record with first set; a later one, until the lease expires, the record and the
	// used of the first, with first unset. A lease the store does not hold (never issued,
	// expired) is ErrUnknownLease.
	SettleLease(ctx context.Context, id []byte, used int64) (rec []byte, firstUsed int64, first bool, err error)
	// RenewLease sets an unsettled lease's expiry to ttl from now and returns its record
	// (the caller renews what the lease holds, a concurrency slot). A settled lease is
	// ErrLeaseSettled, one the store does not hold ErrUnknownLease.
	RenewLease(ctx context.Context, id []byte, ttl time.Duration) (rec []byte, err error)
	// Adjust settles a reservation on its limits: each op's Cost > 0 gives that much back of
	// what the reservation consumed at instant at[i] (Batch.OpAt), a Cost < 0
	// takes that much more even past the limit (algorithm.Adjust). Ops are adjusted all
	// or nothing as a batch is decided (on a Redis Cluster, per hash slot).
	Adjust(ctx context.Context, ops []Op, at []int64) error
}

// ErrUnknownLease is returned by SettleLease for a lease the store does not hold: never
// issued, or expired (and so committed at what it reserved).
var ErrUnknownLease = errors.New("lease: unknown or expired")

// ErrLeaseSettled is returned by RenewLease for a lease already settled: there is nothing
// left to keep alive.
var ErrLeaseSettled = errors.New("lease: already settled")

// AsLeaser returns st as a Leaser, or an error naming st when it keeps no leases.
func AsLeaser(st Store) (Leaser, error) {
	if l, ok := st.(Leaser); ok {
		return l, nil
	}
	return nil, fmt.Errorf("store %T keeps no leases: reservations need the memory or Redis store", st)
}
