// Package memory is Sluice's embedded store: striped maps in the process, with idle keys
// expired and state snapshotted to disk so a restart keeps quota.
//
// A key's state has a lock of its own, and a stripe's table of known keys is read without a
// lock: a check of a known key writes only to its own entry, so cores deciding different keys
// share no cache line. (With a lock per stripe, every check wrote its stripe's lock, and two
// cores spread over all stripes bounced those lines between them: 2 cores decided 1.15x what
// one did.) New keys are added under the stripe's lock (table.go).
package memory

import (
	"bytes"
	"context"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// numShards spreads keys over independent mutexes. A sharded mutex map beats channel-fed
// workers for this kind of map (Gubernator's maintainers found the same); 256
// keeps contention low on big machines and costs 16 KiB.
const numShards = 256

// maxInline is how many ops a batch handles without allocating its bookkeeping; more would
// cost every batch the zeroing of a larger array.
const maxInline = 4

// Store is the in-memory store. Create it with New; Close stops its background work and writes
// a last snapshot.
type Store struct {
	shards [numShards]shard
	idem   [numShards]idemShard
	leases leases
	seed   maphash.Seed
	clock  func() int64
	log    *slog.Logger

	snapshotPath     string
	snapshotInterval time.Duration
	sweepInterval    time.Duration
	// changed is set when any state changed since the last snapshot. Set only when clear, so
	// that its cache line stays shared between cores rather than written by every check.
	changed atomic.Bool

	stop chan struct{}
	done sync.WaitGroup
	once sync.Once
}

// entry is one key's state: algorithm.State and an expiry under a lock of its own, and the key,
// 64 bytes. Memory per key is a target (see newEntry).
type entry struct {
	mu      sync.Mutex
	t, v, w int64
	idleAt  int64          // µs; after it the state is as good as fresh; removed once swept
	log     *algorithm.Log // sliding_window_log's entries
	key     string         // never changed; read without a lock
}

// removed is the idleAt of an entry taken out of its stripe by a sweep: whoever holds it looks
// the key up again.
const removed = -1

type idemShard struct {
	mu sync.Mutex
	m  map[string]*idemEntry
	_  [48]byte
}

// idemEntry is the record of an allowed batch with an idempotency key, bound to the batch's
// fingerprint.
type idemEntry struct {
	results []algorithm.Result
	idleAt  int64
	fp      store.Fingerprint
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the store's clock, in microseconds since the Unix epoch. Tests drive time with
// it; the default is the process's monotonic clock anchored to the wall clock at start.
func WithClock(now func() int64) Option { return func(s *Store) { s.clock = now } }

// WithSnapshot makes the store load path at start and write it every interval (when anything
// changed) and at Close. An interval <= 0 writes only at Close.
func WithSnapshot(path string, interval time.Duration) Option {
	return func(s *Store) { s.snapshotPath, s.snapshotInterval = path, interval }
}

// WithLogger sets the logger for snapshot and sweep problems.
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithSweepInterval sets how often idle keys are dropped (default 1 s; <= 0 never, for tests).
func WithSweepInterval(d time.Duration) Option { return func(s *Store) { s.sweepInterval = d } }

// New returns a Store. With a snapshot path it first loads what the file holds; a missing file
// is a clean start, and of a damaged or truncated one every sound record is read, the damage
// logged, and the file renamed to path.damaged-TIME so that the next save does not replace it.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), log: slog.Default(), sweepInterval: time.Second, stop: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].init(s.seed)
		s.idem[i].m = map[string]*idemEntry{}
	}
	for _, o := range opts {
		o(s)
	}
	if s.clock == nil {
		s.clock = MonotonicClock()
	}
	if s.snapshotPath != "" {
		s.loadFile(s.snapshotPath)
		if s.snapshotInterval > 0 {
			s.done.Add(1)
			go s.every(s.snapshotInterval, func() { s.snapshotIfChanged() })
		}
	}
	if s.sweepInterval > 0 {
		s.done.Add(1)
		go s.every(s.sweepInterval, func() { s.Sweep() })
	}
	return s
}

// MonotonicClock returns a clock in µs since the Unix epoch that never goes backwards: the
// wall clock read once, advanced by the monotonic clock.
func MonotonicClock() func() int64 {
	start := time.Now()
	base := start.UnixMicro()
	return func() int64 { return base + int64(time.Since(start)/time.Microsecond) }
}

// Now returns the store's clock in µs.
func (s *Store) Now() int64 { return s.clock() }

func (s *Store) every(d time.Duration, f func()) {
	defer s.done.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			f()
		}
	}
}

// Close stops the background work and writes a final snapshot.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		s.done.Wait()
		if s.snapshotPath != "" {
			err = s.WriteSnapshot(s.snapshotPath)
		}
	})
	return err
}

func (s *Store) shardOf(k []byte) int { return int(s.hashOf(k) % numShards) }

// hashOf is a key's hash: its low bits choose the stripe, the next ones the slot.
func (s *Store) hashOf(k []byte) uint64 { return maphash.Bytes(s.seed, k) }

// pending is the bookkeeping of one op while its batch is decided. The op works on a copy of
// its key's state, written back only if the batch commits.
type pending struct {
	shard  int
	hash   uint64
	e      *entry          // the key's entry, locked while the batch is decided
	st     algorithm.State // the working copy
	alias  int             // an earlier op of the batch on the same key, whose copy this one shares; -1 if none
	undo   algorithm.Undo
	idleAt int64 // of the key, on its first op
	commit bool
	dirty  bool // on a key's first op: some op on the key committed
}

// stateOf returns the working copy op i decides on: its alias's or its own.
func stateOf(ps []pending, i int) *algorithm.State {
	if ps[i].alias >= 0 {
		i = ps[i].alias
	}
	return &ps[i].st
}

// Apply decides every op of b at one instant and consumes all of them only if every non-shadow
// op is allowed. results[i] receives op i's result; replayed reports an idempotent replay.
// Its only error is store.ErrIdempotencyMismatch.
func (s *Store) Apply(_ context.Context, b *store.Batch, results []algorithm.Result) (replayed bool, err error) {
	if len(b.IdempotencyKey) == 0 {
		now := s.clock()
		b.SetAt(now)
		s.apply(b.Ops, results, now)
		return false, nil
	}
	// The idempotency stripe is locked before any bucket stripe, always, so two retries of one
	// request cannot both miss and both consume.
	is := &s.idem[s.shardOf(b.IdempotencyKey)]
	is.mu.Lock()
	defer is.mu.Unlock()
	now := s.clock()
	if e := is.m[string(b.IdempotencyKey)]; e != nil && e.idleAt > now {
		// The same fingerprint means the same ops, so the counts agree but for a corrupt
		// record; that is refused too rather than replayed in part.
		if e.fp != b.IdempotencyFingerprint || len(e.results) != len(results) {
			return false, store.ErrIdempotencyMismatch
		}
		copy(results, e.results)
		return true, nil
	}
	b.SetAt(now)
	s.apply(b.Ops, results, now)
	// Only an allowed decision is remembered: a retry after a denial's Retry-After must be
	// decided afresh, and denials (cheap to provoke) must not fill memory for the TTL.
	for i := range results {
		if !results[i].Allowed && b.Ops[i].Binding() {
			return false, nil
		}
	}
	is.m[string(b.IdempotencyKey)] = &idemEntry{
		results: append([]algorithm.Result(nil), results...),
		idleAt:  now + b.IdempotencyTTL.Microseconds(),
		fp:      b.IdempotencyFingerprint,
	}
	s.markChanged()
	return false, nil
}

func (s *Store) apply(ops []store.Op, results []algorithm.Result, now int64) {
	if len(ops) == 1 && ops[0].Params.Kind != algorithm.Concurrency {
		s.applyOne(&ops[0], &results[0], now)
		return
	}
	var inline [maxInline]pending
	ps := inline[:]
	if len(ops) > maxInline {
		ps = make([]pending, len(ops))
	}
	ps = ps[:len(ops)]
	for i := range ops {
		ps[i].hash = s.hashOf(ops[i].Key)
		ps[i].shard, ps[i].alias = int(ps[i].hash%numShards), -1
	}
	s.acquire(ops, ps, now)
	defer release(ps)

	allowed := true
	for i := range ops {
		op, p := &ops[i], &ps[i]
		st := stateOf(ps, i)
		r := &results[i]
		algorithm.DecideInto(op.Params, st, now, op.Cost, r)
		if !r.Allowed {
			allowed = allowed && !op.Binding()
			continue
		}
		// A concurrency limit takes a slot only for a lease that names it; without one the op
		// only asked whether a slot is free.
		slots := op.Params.Kind == algorithm.Concurrency
		if op.Cost > 0 && (!slots || op.Slot != nil) {
			// Commit at once so that a later op on the same key sees it; undo if a sibling
			// denies (the log's entries are shared with the entry; the rest is a copy). A
			// counter counts whatever its siblings decide: its commit is never undone.
			p.undo.Save(st)
			p.commit = !op.Counter
			var idle int64
			if slots {
				idle = algorithm.TakeSlot(st, now, string(op.Slot), op.SlotTTL)
			} else {
				idle = algorithm.Commit(op.Params, st, now, op.Cost)
			}
			root := p
			if p.alias >= 0 {
				root = &ps[p.alias]
			}
			root.dirty, root.idleAt = true, max(root.idleAt, idle)
		}
	}
	if !allowed {
		for i := len(ops) - 1; i >= 0; i-- {
			if ps[i].commit {
				ps[i].undo.Restore(stateOf(ps, i))
			}
		}
		// Allowed ops of a denied batch consumed nothing: report what they really have left.
		// Counters did consume, and are written back.
		for i := range ops {
			if ops[i].Counter {
				continue
			}
			if results[i].Allowed && ops[i].Cost > 0 {
				r := algorithm.Decide(ops[i].Params, stateOf(ps, i), now, 0)
				results[i].Remaining, results[i].ResetAfter, results[i].Delay = r.Remaining, r.ResetAfter, 0
			}
			ps[i].dirty = false
		}
		s.drain(ops, ps, results, now)
	}
	changed := false
	for i := range ops {
		p := &ps[i]
		if p.alias < 0 && p.st.Log != nil {
			p.st.Log.Unpin() // the batch's Undos are done with
		}
		// Only what committed is written back, as in the Redis store: a look must not rewrite
		// state (another tier's parameters would convert it, or prune a log by its period).
		if p.alias >= 0 || !p.dirty {
			continue
		}
		changed = true
		p.e.save(&p.st, p.idleAt)
	}
	if changed {
		s.markChanged()
	}
}

// applyOne is apply for the most common batch, a request that one limit covers: with no
// sibling to deny it, it decides and commits on the entry in place, with none of a batch's
// bookkeeping.
func (s *Store) applyOne(op *store.Op, res *algorithm.Result, now int64) {
	h := s.hashOf(op.Key)
	sh := &s.shards[h%numShards]
	for {
		var st algorithm.State
		e := sh.acquire(op.Key, h, false)
		if e == nil {
			// A key the stripe does not hold: decide on a fresh state and add the key only if
			// the op commits, so that looks and denials of unknown keys leave nothing behind.
			idle, committed := algorithm.Take(op.Params, &st, now, op.Cost, res)
			if !committed {
				return
			}
			if !sh.insert(op.Key, h, &st, idle) {
				continue // another op added the key meanwhile: decide on its entry
			}
			s.markChanged()
			return
		}
		e.load(op.Params.Kind, now, &st)
		idle, committed := algorithm.Take(op.Params, &st, now, op.Cost, res)
		if !committed && drains(op, res) {
			idle, committed = max(e.idleAt, algorithm.Drain(op.Params, &st, now)), true
			algorithm.DecideInto(op.Params, &st, now, op.Cost, res)
		}
		if committed {
			e.save(&st, idle)
		}
		e.mu.Unlock()
		if committed {
			s.markChanged()
		}
		return
	}
}

// drains reports whether op, whose result is r, drains: a binding limit set to drain on deny
// that denied a request waiting could admit. A key the store does not hold never does: a
// fresh limit denies only a cost it can never admit.
func drains(op *store.Op, r *algorithm.Result) bool {
	return !r.Allowed && r.Reason == algorithm.ReasonNone && op.Params.Drains() && op.Binding()
}

// drain empties the limits of a denied batch that drain on deny (algorithm.Drain), after the
// batch's commits were undone, and reports each as the drained state decides.
func (s *Store) drain(ops []store.Op, ps []pending, results []algorithm.Result, now int64) {
	for i := range ops {
		if !drains(&ops[i], &results[i]) {
			continue
		}
		root := &ps[i]
		if root.alias >= 0 {
			root = &ps[root.alias]
		}
		if root.e == nil {
			continue // a fresh key (see drains)
		}
		st := stateOf(ps, i)
		idle := algorithm.Drain(ops[i].Params, st, now)
		root.dirty, root.idleAt = true, max(root.idleAt, root.e.idleAt, idle)
		algorithm.DecideInto(ops[i].Params, st, now, ops[i].Cost, &results[i])
	}
}

// markChanged notes a change for the next snapshot.
func (s *Store) markChanged() {
	if !s.changed.Load() {
		s.changed.Store(true)
	}
}

// acquire gives every op of a batch its working state: a copy of its key's entry, locked, or
// the copy of the first op on the same key. Entries are locked in ascending (stripe, key) order,
// so batches never deadlock.
func (s *Store) acquire(ops []store.Op, ps []pending, now int64) {
	var inline [maxInline]int
	roots := inline[:0]
	for i := range ops {
		for j := range i {
			if ps[j].alias < 0 && ps[j].shard == ps[i].shard && bytes.Equal(ops[j].Key, ops[i].Key) {
				ps[i].alias = j
				break
			}
		}
		if ps[i].alias < 0 {
			roots = append(roots, i)
		}
	}
	// Insertion sort: batches are a few ops, and slices.SortFunc's calls through a closure
	// cost more than the sorting.
	for n := 1; n < len(roots); n++ {
		for m := n; m > 0 && lockedBefore(ops, ps, roots[m], roots[m-1]); m-- {
			roots[m], roots[m-1] = roots[m-1], roots[m]
		}
	}
	// A batch that only looks needs no entry for a key the store does not hold: it decides on
	// a fresh state and writes nothing back.
	create := false
	for i := range ops {
		create = create || ops[i].Cost > 0
	}
	for _, i := range roots {
		if ps[i].e = s.shards[ps[i].shard].acquire(ops[i].Key, ps[i].hash, create); ps[i].e != nil {
			ps[i].e.load(ops[i].Params.Kind, now, &ps[i].st)
		}
	}
}

// lockedBefore reports whether op a's entry is locked before op b's: by stripe, then key.
func lockedBefore(ops []store.Op, ps []pending, a, b int) bool {
	if ps[a].shard != ps[b].shard {
		return ps[a].shard < ps[b].shard
	}
	return bytes.Compare(ops[a].Key, ops[b].Key) < 0
}

// release unlocks what acquire locked.
func release(ps []pending) {
	for i := range ps {
		if ps[i].alias < 0 && ps[i].e != nil {
			ps[i].e.mu.Unlock()
		}
	}
}

// load sets st, zero on entry, to a working copy of e's state: fresh when idle, with a log of
// its own header. e is locked.
func (e *entry) load(kind algorithm.Kind, now int64, st *algorithm.State) {
	if e.idleAt <= now {
		lg := e.log
		e.t, e.v, e.w, e.idleAt, e.log = 0, 0, 0, 0, nil // as good as fresh
		if kind == algorithm.SlidingWindowCounter && lg != nil {
			lg.ClearCounter() // its array serves the key's next buckets
			e.log = lg
		}
	}
	st.T, st.V, st.W = e.t, e.v, e.w
	if kind == algorithm.SlidingWindowCounter {
		// A counter's Decide only reads its buckets, and Commit changes them where Undo can
		// put them back: the copy shares them. The entry keeps the Log even when a sibling's
		// denial undoes the commit that made it, so that the key's next batch finds the
		// buckets' array there instead of allocating one again.
		if e.log == nil {
			e.log = &algorithm.Log{}
		}
		st.Log = e.log
	}
	if kind == algorithm.Concurrency && e.log != nil {
		// Decide drops expired slots in place and TakeSlot appends: neither may reach the
		// stored slots unless the batch commits.
		st.Log = &algorithm.Log{Slots: slices.Clone(e.log.Slots)}
	}
	if kind == algorithm.SlidingWindowLog && e.log != nil {
		// The working copy gets its own header: Decide prunes by reslicing it, which must
		// not reach the stored log unless the batch commits. (Commit's in-place merge into
		// the last entry is undone by Undo when a sibling denies.)
		cp := *e.log
		st.Log = &cp
	}
}

// save writes back the committed working state st. e is locked.
func (e *entry) save(st *algorithm.State, idleAt int64) {
	e.t, e.v, e.w, e.idleAt = st.T, st.V, st.W, max(e.idleAt, idleAt)
	if st.Log != nil {
		e.log = st.Log
	}
}

// Reset drops the state of keys, restoring them to full.
func (s *Store) Reset(_ context.Context, keys [][]byte) error {
	for _, k := range keys {
		h := s.hashOf(k)
		if e := s.shards[h%numShards].acquire(k, h, false); e != nil {
			e.t, e.v, e.w, e.idleAt, e.log = 0, 0, 0, 0, nil // fresh; the sweep drops it
			e.mu.Unlock()
		}
	}
	s.markChanged()
	return nil
}

// Sweep drops idle keys and expired idempotency records, one stripe at a time so no lock is
// held for long. An entry in use is left for the next sweep.
func (s *Store) Sweep() {
	now := s.clock()
	s.sweepLeases(now)
	for i := range s.shards {
		s.shards[i].sweep(now)
		is := &s.idem[i]
		is.mu.Lock()
		for k, e := range is.m {
			if e.idleAt <= now {
				delete(is.m, k)
			}
		}
		is.mu.Unlock()
	}
}

// Len returns the number of keys held, idle ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.entries(func(string, *entry) { n++ })
		sh.mu.Unlock()
	}
	return n
}
