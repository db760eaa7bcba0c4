// Package memory is Sluice's embedded store: lock-striped maps in the process, with idle keys
// expired and state snapshotted to disk so a restart keeps quota.
package memory

import (
	"bytes"
	"context"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// numShards spreads keys over independent mutexes. A sharded mutex map measured faster than
// channel-fed workers for this kind of map (STYLE.md, Gubernator); 256 keeps contention low on
// big machines and costs 16 KiB.
const numShards = 256

// maxInline is how many ops a batch handles without allocating its bookkeeping; more would
// cost every batch the zeroing of a larger array.
const maxInline = 4

// Store is the in-memory store. Create it with New; Close stops its background work and writes
// a last snapshot.
type Store struct {
	shards [numShards]shard
	idem   [numShards]idemShard
	seed   maphash.Seed
	clock  func() int64
	log    *slog.Logger

	snapshotPath     string
	snapshotInterval time.Duration
	sweepInterval    time.Duration
	idemCommits      atomic.Uint64 // idempotency records and resets since start
	lastSnapshot     atomic.Uint64 // changes counted at the last snapshot written

	stop chan struct{}
	done sync.WaitGroup
	once sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	// logs holds the entries of sliding_window_log keys, apart from m so that every other
	// key's entry stays 32 bytes.
	logs map[string]*algorithm.Log
	// commits counts changes under mu; a counter per stripe, because one shared atomic
	// written by every request would bounce its cache line between cores.
	commits uint64
	_       [32]byte // keep neighbouring mutexes off one cache line
}

// entry is one key's state: algorithm.State's integers and an expiry, 32 bytes, a size class
// below what algorithm.State with its log pointer would take. Memory per key is a target.
type entry struct {
	t, v, w int64
	idleAt  int64 // µs; after it the state is as good as fresh
}

type idemShard struct {
	mu sync.Mutex
	m  map[string]*idemEntry
	_  [48]byte
}

type idemEntry struct {
	results []algorithm.Result
	idleAt  int64
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
// is a clean start, and a corrupt or truncated one is logged and read as far as it is sound.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), log: slog.Default(), sweepInterval: time.Second, stop: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].m = map[string]*entry{}
		s.shards[i].logs = map[string]*algorithm.Log{}
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

func (s *Store) shardOf(k []byte) int { return int(maphash.Bytes(s.seed, k) % numShards) }

// pending is the bookkeeping of one op while its batch is decided. The op works on a copy of
// its key's state, written back only if the batch commits.
type pending struct {
	shard  int
	e      *entry          // the map's entry; nil while the key is new
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
// It never fails: the error is for the Store interface.
func (s *Store) Apply(_ context.Context, b *store.Batch, results []algorithm.Result) (replayed bool, err error) {
	if len(b.IdempotencyKey) == 0 {
		s.apply(b.Ops, results, s.clock())
		return false, nil
	}
	// The idempotency stripe is locked before any bucket stripe, always, so two retries of one
	// request cannot both miss and both consume.
	is := &s.idem[s.shardOf(b.IdempotencyKey)]
	is.mu.Lock()
	defer is.mu.Unlock()
	now := s.clock()
	if e := is.m[string(b.IdempotencyKey)]; e != nil && e.idleAt > now {
		for i := range results {
			if i < len(e.results) {
				results[i] = e.results[i]
			} else {
				// The policy changed between the tries: report the extra limit as untouched.
				results[i] = algorithm.Result{Allowed: true}
			}
		}
		return true, nil
	}
	s.apply(b.Ops, results, now)
	is.m[string(b.IdempotencyKey)] = &idemEntry{
		results: append([]algorithm.Result(nil), results...),
		idleAt:  now + b.IdempotencyTTL.Microseconds(),
	}
	s.idemCommits.Add(1)
	return false, nil
}

func (s *Store) apply(ops []store.Op, results []algorithm.Result, now int64) {
	if len(ops) == 1 {
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
		ps[i].shard, ps[i].alias = s.shardOf(ops[i].Key), -1
	}
	// A batch of one op has no sibling to deny it, so it never needs to undo.
	mayUndo := len(ops) > 1
	s.lock(ps)
	defer s.unlock(ps)

	allowed := true
	for i := range ops {
		op, p := &ops[i], &ps[i]
		s.lookup(ops, ps, i, now)
		st := stateOf(ps, i)
		r := &results[i]
		algorithm.DecideInto(op.Params, st, now, op.Cost, r)
		if !r.Allowed {
			allowed = allowed && op.Shadow
			continue
		}
		if op.Cost > 0 {
			// Commit at once so that a later op on the same key sees it; undo if a sibling
			// denies (the log's entries are shared with the map; the rest is a copy).
			if mayUndo {
				p.undo = algorithm.Save(st)
			}
			idle := algorithm.Commit(op.Params, st, now, op.Cost)
			p.commit = true
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
		for i := range ops {
			if results[i].Allowed && ops[i].Cost > 0 {
				r := algorithm.Decide(ops[i].Params, stateOf(ps, i), now, 0)
				results[i].Remaining, results[i].ResetAfter, results[i].Delay = r.Remaining, r.ResetAfter, 0
			}
			ps[i].dirty = false
		}
	}
	changed := false
	for i := range ops {
		p := &ps[i]
		// Only what committed is written back, as in the Redis store: a look must not rewrite
		// state (another tier's parameters would convert it, or prune a log by its period).
		if p.alias >= 0 || !p.dirty {
			continue
		}
		changed = changed || p.dirty
		s.shards[p.shard].save(ops[i].Key, p.e, &p.st, p.idleAt)
	}
	if changed {
		s.shards[ps[0].shard].commits++
	}
}

// applyOne is apply for the most common batch, a request that one limit covers: with no
// sibling to deny it, it decides and commits on the entry in place, with none of a batch's
// bookkeeping.
func (s *Store) applyOne(op *store.Op, res *algorithm.Result, now int64) {
	sh := &s.shards[s.shardOf(op.Key)]
	sh.mu.Lock()
	var st algorithm.State
	e := sh.load(op.Key, op.Params.Kind, now, &st)
	if idle, committed := algorithm.Take(op.Params, &st, now, op.Cost, res); committed {
		sh.save(op.Key, e, &st, idle)
		sh.commits++
	}
	sh.mu.Unlock()
}

// lookup gives op i its working state: an earlier op of the batch on the same key shares its
// copy; else a copy of the map's entry.
func (s *Store) lookup(ops []store.Op, ps []pending, i int, now int64) {
	for j := range i {
		if ps[j].shard == ps[i].shard && bytes.Equal(ops[j].Key, ops[i].Key) {
			ps[i].alias = j
			return
		}
	}
	ps[i].e = s.shards[ps[i].shard].load(ops[i].Key, ops[i].Params.Kind, now, &ps[i].st)
}

// load returns key's entry (nil while the key is new) and sets st, zero on entry, to a working
// copy of its state: fresh when idle, with a log of its own header. The stripe is locked.
func (sh *shard) load(key []byte, kind algorithm.Kind, now int64, st *algorithm.State) *entry {
	e := sh.m[string(key)]
	if e != nil {
		if e.idleAt <= now {
			*e = entry{} // as good as fresh, and cheaper than a delete and an insert
			if len(sh.logs) > 0 {
				delete(sh.logs, string(key))
			}
		}
		st.T, st.V, st.W = e.t, e.v, e.w
	}
	if kind == algorithm.SlidingWindowLog {
		if log := sh.logs[string(key)]; log != nil {
			// The working copy gets its own header: Decide prunes by reslicing it, which must
			// not reach the stored log unless the batch commits. (Commit's in-place merge into
			// the last entry is undone by Undo when a sibling denies.)
			cp := *log
			st.Log = &cp
		}
	}
	return e
}

// save writes back the committed working state st of key, whose entry load returned as e.
func (sh *shard) save(key []byte, e *entry, st *algorithm.State, idleAt int64) {
	if e == nil {
		e = new(entry)
		sh.m[string(key)] = e
	}
	e.t, e.v, e.w, e.idleAt = st.T, st.V, st.W, max(e.idleAt, idleAt)
	if st.Log != nil {
		sh.logs[string(key)] = st.Log
	}
}

// lock takes the batch's stripes in ascending order, each once, so batches never deadlock.
func (s *Store) lock(ps []pending) {
	if len(ps) == 1 {
		s.shards[ps[0].shard].mu.Lock()
		return
	}
	last := -1
	for {
		next := numShards
		for i := range ps {
			if ps[i].shard > last && ps[i].shard < next {
				next = ps[i].shard
			}
		}
		if next == numShards {
			return
		}
		s.shards[next].mu.Lock()
		last = next
	}
}

func (s *Store) unlock(ps []pending) {
	for i := range ps {
		first := true
		for j := range i {
			if ps[j].shard == ps[i].shard {
				first = false
				break
			}
		}
		if first {
			s.shards[ps[i].shard].mu.Unlock()
		}
	}
}

// Reset drops the state of keys, restoring them to full.
func (s *Store) Reset(_ context.Context, keys [][]byte) error {
	for _, k := range keys {
		sh := &s.shards[s.shardOf(k)]
		sh.mu.Lock()
		delete(sh.m, string(k))
		delete(sh.logs, string(k))
		sh.mu.Unlock()
	}
	s.idemCommits.Add(1)
	return nil
}

// Sweep drops idle keys and expired idempotency records, one stripe at a time so no lock is
// held for long.
func (s *Store) Sweep() {
	now := s.clock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.idleAt <= now {
				delete(sh.m, k)
				delete(sh.logs, k)
			}
		}
		sh.mu.Unlock()
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

// changes sums the stripes' change counters: it moves whenever any state changed.
func (s *Store) changes() uint64 {
	n := s.idemCommits.Load()
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += s.shards[i].commits
		s.shards[i].mu.Unlock()
	}
	return n
}

// Len returns the number of keys held, idle ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].m)
		s.shards[i].mu.Unlock()
	}
	return n
}
