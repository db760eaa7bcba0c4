// Package split routes the limits of a request to two stores by their period: limits of a
// second or less to one store, the rest to another, as Envoy's reference rate limit service
// does with a second Redis for its per-second limits (REDIS_PERSECOND). Per-second counters
// are the busiest and the shortest-lived, so a deployment keeps them on a Redis of their own.
//
// A request whose limits all live in one store is that store's request: one call, all or
// nothing, as without the split. A request with limits in both is two calls, one after the
// other, and no longer atomic across them (the reference's two pipelines are not either):
//
//   - The per-second part is decided first, for real. Per-second limits are the ones that
//     deny most often, so this order keeps what a denial can leave consumed small.
//   - When it denies, the other part is decided without consuming (a denying op is added to
//     its batch, so the store reports what its limits would say and takes nothing; escalation
//     counters count, as they count denied requests): a denied request consumes nothing.
//   - When it allows, the other part is decided for real. If that part denies, the request is
//     denied, and what the per-second part consumed stays consumed: at most the request's cost
//     on each per-second limit, for the rest of its second at most.
//
// The price is a second round trip for the requests that have limits of both kinds.
package split

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/store"
)

// DefaultCutoff is the longest period that goes to the per-second store: Envoy's unit second.
const DefaultCutoff = time.Second

// Store sends each op of a batch to Short when its period is at most the cutoff, and to Long
// otherwise. Create it with New.
type Store struct {
	long, short store.Store
	cutoff      int64 // µs
	deny        algorithm.Params
	scratches   sync.Pool // *scratch
}

// New returns a store routing ops with a period of at most cutoff (DefaultCutoff when 0) to
// short, the others to long. It owns both: Close closes them.
func New(long, short store.Store, cutoff time.Duration) *Store {
	if cutoff <= 0 {
		cutoff = DefaultCutoff
	}
	// A fixed window of limit 0 denies any cost: the op that makes a batch a look.
	deny, err := algorithm.NewParams(algorithm.FixedWindow, 0, 0, time.Second)
	if err != nil {
		panic(err) // constant parameters: cannot fail
	}
	s := &Store{long: long, short: short, cutoff: cutoff.Microseconds(), deny: deny}
	s.scratches.New = func() any { return new(scratch) }
	return s
}

// scratch is one Apply's two batches and their results, pooled so that a request with limits
// in both stores allocates nothing once the pool is warm.
type scratch struct {
	parts [2]part
	key   []byte
}

// part is the ops of a batch that go to one store, and where each came from.
type part struct {
	b       store.Batch
	results []algorithm.Result
	from    []int
}

func (p *part) reset(b *store.Batch) {
	p.b.Ops, p.results, p.from = p.b.Ops[:0], p.results[:0], p.from[:0]
	p.b.IdempotencyKey, p.b.IdempotencyTTL, p.b.IdempotencyFingerprint = b.IdempotencyKey, b.IdempotencyTTL, b.IdempotencyFingerprint
	p.b.HotKey, p.b.Lease = false, b.Lease
	p.b.OpAt = p.b.OpAt[:0]
}

func (p *part) add(op *store.Op, i int) {
	p.b.Ops = append(p.b.Ops, *op)
	p.from = append(p.from, i)
	p.results = append(p.results, algorithm.Result{})
}

// isShort reports whether op goes to the per-second store.
func (s *Store) isShort(op *store.Op) bool { return op.Params.Period <= s.cutoff }

// Apply decides b: in one store when its ops all go there, else in both, per-second part
// first (see the package comment). replayed is true only when every part applied replayed.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	short := 0
	for i := range b.Ops {
		if s.isShort(&b.Ops[i]) {
			short++
		}
	}
	switch short {
	case 0:
		return s.long.Apply(ctx, b, results)
	case len(b.Ops):
		replayed, err := s.short.Apply(ctx, b, results)
		return replayed, wrapShort(err)
	}
	sc := s.scratches.Get().(*scratch)
	defer s.scratches.Put(sc)
	sp, lp := &sc.parts[0], &sc.parts[1]
	sp.reset(b)
	lp.reset(b)
	for i := range b.Ops {
		if s.isShort(&b.Ops[i]) {
			sp.add(&b.Ops[i], i)
		} else {
			lp.add(&b.Ops[i], i)
		}
	}
	sp.askAt(b)
	lp.askAt(b)
	shortReplayed, err := s.short.Apply(ctx, &sp.b, sp.results)
	if err != nil {
		return false, wrapShort(err)
	}
	sp.copyTo(results)
	look := denied(&sp.b, sp.results)
	if look {
		// Decided, not consumed: the added op denies the batch. No idempotency record
		// either way (a denied batch leaves none), so none is asked for.
		sc.key = lookKey(sc.key[:0], lp.b.Ops[0].Key)
		lp.b.Ops = append(lp.b.Ops, store.Op{Key: sc.key, Params: &s.deny, Cost: 1})
		lp.results = append(lp.results, algorithm.Result{})
		lp.b.IdempotencyKey = nil
	}
	longReplayed, err := s.long.Apply(ctx, &lp.b, lp.results)
	if err != nil {
		return false, err
	}
	if look {
		lp.results = lp.results[:len(lp.from)]
	}
	lp.copyTo(results)
	sp.copyAt(b)
	lp.copyAt(b)
	b.HotKey = sp.b.HotKey || lp.b.HotKey
	clear(sp.b.Ops) // drop the keys, which are the caller's
	clear(lp.b.Ops)
	return shortReplayed && longReplayed && !look, nil
}

func (p *part) copyTo(results []algorithm.Result) {
	for j, i := range p.from {
		results[i] = p.results[j]
	}
}

// askAt asks the part's store for its ops' instants when b asks for them.
func (p *part) askAt(b *store.Batch) {
	if len(b.OpAt) == len(b.Ops) {
		p.b.OpAt = append(p.b.OpAt[:0], make([]int64, len(p.b.Ops))...)
	}
}

// copyAt copies the instants the part's store reported into b.
func (p *part) copyAt(b *store.Batch) {
	if len(b.OpAt) == len(b.Ops) && len(p.b.OpAt) == len(p.from) {
		for j, i := range p.from {
			b.OpAt[i] = p.b.OpAt[j]
		}
	}
}

// denied reports whether a binding op of b was denied: the store consumed nothing of b.
func denied(b *store.Batch, results []algorithm.Result) bool {
	for i := range b.Ops {
		if !results[i].Allowed && b.Ops[i].Binding() {
			return true
		}
	}
	return false
}

// lookKey is the key of the op that makes a batch a look: under the hash tag of k, so that on
// a Redis Cluster it lands on k's slot and costs no call of its own. It is never written (a
// limit of 0 consumes nothing), and no bucket key can take its name ("!" is no rule id).
func lookKey(dst, k []byte) []byte {
	dst = append(dst, key.Prefix...)
	dst = append(dst, "!split:{"...)
	return append(append(dst, key.HashTag(k)...), '}')
}

// wrapShort names the per-second store in its errors, keeping what they wrap.
func wrapShort(err error) error {
	if err == nil || errors.Is(err, store.ErrIdempotencyMismatch) {
		return err
	}
	return fmt.Errorf("per-second store: %w", err)
}

// Reset drops keys in both stores: a key does not tell its period.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	return errors.Join(s.long.Reset(ctx, keys), wrapShort(s.short.Reset(ctx, keys)))
}

// Ping asks both stores (store.Pinger).
func (s *Store) Ping(ctx context.Context) error {
	return errors.Join(store.Ping(ctx, s.long), wrapShort(store.Ping(ctx, s.short)))
}

// Close closes both stores.
func (s *Store) Close() error {
	return errors.Join(s.long.Close(), s.short.Close())
}
