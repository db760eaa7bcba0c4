// Package allowance lets a node hold a little of a fixed window's quota and decide that
// window's next requests itself, without a round trip to the shared store.
//
// When a request goes to the store on a fixed window far from its limit, it asks Limit/Share
// units more than it costs (a grant, at most MaxGrant). The store counts them at once, so the
// fleet's count never runs past a limit: a node spends only what the store already counted.
// The node then admits the key's next requests from the units it holds, until they run out or
// the window may have ended; requests of the key that arrive while a grant is on its way wait
// for it rather than make a round trip of their own. Units left unspent for Idle go back to
// the store (Leaser.Adjust), and a request the store must decide takes the units its node
// holds off what it asks, so on one node every decision is the one the store alone would make.
//
// The price is paid by the other nodes: a count in the store includes what each node holds
// and has not spent, at most one grant per key per node, for at most Idle past its last use
// (or until its window ends). Until then another node may deny a request the store alone would
// have admitted: never more admissions, up to a grant per node fewer for that while
// (docs/architecture.md, Node allowances).
package allowance

import (
	"bytes"
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Options tune allowances; zero values take the defaults.
type Options struct {
	// Share sets a grant to a key's limit divided by it (default 32).
	Share int64
	// MaxGrant caps a grant (default 4096 units).
	MaxGrant int64
	// Idle is how long a node keeps units it does not spend before it gives them back
	// (default 100 ms).
	Idle time.Duration
	// Now is the node's monotonic clock in µs; tests inject it. Default: time since New.
	Now func() int64
}

// maxOps is the most limits a request may have to be decided from allowances; a request
// under more goes to the store whole (its entries' lookups use an array on the stack).
const maxOps = 8

// minGrant is the smallest grant asked: a limit below Share*minGrant is left to the store.
const minGrant = 2

// discountGuard keeps a request the store decides from counting held units within it of
// their window's end: the request may reach the store after the window turned over, where
// those units were never counted (see applyShared).
const discountGuard = 5 * time.Millisecond

// shardCount splits the entries so that a sweep holds up only the lookups of one part.
const shardCount = 32

// shard is one part of a node's entries, by their keys' hash.
type shard struct {
	mu      sync.RWMutex
	entries map[string]*entry
}

// Store decides from held units what it can and passes the rest to the shared store.
type Store struct {
	inner  store.Store
	leaser store.Leaser
	o      Options
	guard  int64 // discountGuard in µs

	seed   maphash.Seed
	shards [shardCount]shard

	local, shared, granted, givenBack, uncounted atomic.Int64

	stop chan struct{}
	done sync.WaitGroup
}

// entry is what a node knows of one key: the units it holds and the store's last word.
type entry struct {
	mu        sync.Mutex
	key       []byte
	params    *algorithm.Params
	held      int64 // counted in the store, not yet spent here
	remaining int64 // the store's Remaining at its last answer; -1 unknown
	windowEnd int64 // the store's clock, µs: the window held units were counted in
	end       int64 // local µs before which that window has surely not ended
	at        int64 // the store's instant of the last grant, which a give-back names
	used      int64 // local µs of the last spend or grant
	fetching  chan struct{}
	dead      bool // dropped from the table by the sweep: takes no grant
}

// New wraps inner, which must keep leases (store.Leaser) so that unspent units can go back.
// Close gives back what is held and closes inner.
func New(inner store.Store, o Options) (*Store, error) {
	s, err := newStore(inner, o)
	if err != nil {
		return nil, err
	}
	s.done.Add(1)
	go s.loop()
	return s, nil
}

// newStore is New without the background sweep: tests call sweep themselves.
func newStore(inner store.Store, o Options) (*Store, error) {
	l, err := store.AsLeaser(inner)
	if err != nil {
		return nil, err
	}
	if o.Share <= 0 {
		o.Share = 32
	}
	if o.MaxGrant <= 0 {
		o.MaxGrant = 4096
	}
	if o.Idle <= 0 {
		o.Idle = 100 * time.Millisecond
	}
	if o.Now == nil {
		born := time.Now()
		o.Now = func() int64 { return time.Since(born).Microseconds() }
	}
	s := &Store{inner: inner, leaser: l, o: o, guard: discountGuard.Microseconds(), seed: maphash.MakeSeed(), stop: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].entries = map[string]*entry{}
	}
	return s, nil
}

func (s *Store) shardOf(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)%shardCount]
}

// lookup returns the entry of key, or nil.
func (s *Store) lookup(key []byte) *entry {
	sh := s.shardOf(key)
	sh.mu.RLock()
	e := sh.entries[string(key)]
	sh.mu.RUnlock()
	return e
}

// grant is the units a node asks beside a request on a limit of p, 0 for none.
func (s *Store) grant(p *algorithm.Params) int64 {
	g := min(p.Limit/s.o.Share, s.o.MaxGrant)
	if g < minGrant {
		return 0
	}
	return g
}

// eligible reports whether every op of b may be decided from allowances: binding fixed
// windows (not draining, which empties a limit the node could not see) with a grant, a cost
// within the grant, and keys of their own. Reservations and idempotent requests go to the
// store whole: their records and settlements live there.
func (s *Store) eligible(b *store.Batch) bool {
	if b.Lease || len(b.IdempotencyKey) > 0 || len(b.Ops) == 0 || len(b.Ops) > maxOps {
		return false
	}
	for i := range b.Ops {
		op := &b.Ops[i]
		p := op.Params
		if p.Kind != algorithm.FixedWindow || !op.Binding() || p.Drains() || op.Slot != nil ||
			op.Cost <= 0 || op.Cost > s.grant(p) {
			return false
		}
		for j := range i {
			if bytes.Equal(b.Ops[j].Key, op.Key) {
				return false
			}
		}
	}
	return true
}

// Apply decides b from held units when each of its limits holds enough, all or nothing;
// otherwise the store decides it, with the units held taken off what it asks, and grants
// asked beside it.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	if !s.eligible(b) {
		s.release(ctx, b.Ops)
		return s.inner.Apply(ctx, b, results)
	}
	var arr [maxOps]*entry
	ents := s.entriesOf(b, arr[:len(b.Ops)])
	for waited := false; ; waited = true {
		if s.decideLocal(b, ents, results) {
			s.local.Add(1)
			return false, nil
		}
		ch := s.awaited(b, ents)
		if waited || ch == nil {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	s.shared.Add(1)
	return false, s.applyShared(ctx, b, ents, results, true)
}

// entriesOf finds or makes the entry of each op's key.
func (s *Store) entriesOf(b *store.Batch, ents []*entry) []*entry {
	for i := range b.Ops {
		key := b.Ops[i].Key
		e := s.lookup(key)
		if e == nil {
			sh := s.shardOf(key)
			sh.mu.Lock()
			if e = sh.entries[string(key)]; e == nil {
				e = &entry{key: bytes.Clone(key), remaining: -1}
				sh.entries[string(e.key)] = e
			}
			sh.mu.Unlock()
		}
		ents[i] = e
	}
	return ents
}

// spendable reports whether e's held units may admit a request on a limit of p at local
// instant now: their window has surely not ended, and the limit is the one they were granted
// under (a lowered limit may already be spent).
func (e *entry) spendable(p *algorithm.Params, now int64) bool {
	return e.held > 0 && now < e.end && sameLimit(e.params, p)
}

func sameLimit(a, b *algorithm.Params) bool {
	return a != nil && a.Kind == b.Kind && a.Limit == b.Limit && a.Period == b.Period &&
		a.Calendar() == b.Calendar()
}

// decideLocal admits b from held units if every op's key holds its cost, and reports whether
// it did. It never denies: a request the units do not cover goes to the store.
func (s *Store) decideLocal(b *store.Batch, ents []*entry, results []algorithm.Result) bool {
	now := s.o.Now()
	var windows [maxOps]int64
	for i := range b.Ops {
		op, e := &b.Ops[i], ents[i]
		e.mu.Lock()
		ok := e.spendable(op.Params, now) && e.held >= op.Cost
		if ok {
			e.held -= op.Cost
			e.used = now
			windows[i] = e.windowEnd
			results[i] = algorithm.Result{Allowed: true, Remaining: max(0, e.remaining) + e.held, ResetAfter: e.end - now}
		}
		e.mu.Unlock()
		if !ok {
			for j := range i {
				ents[j].mu.Lock()
				if ents[j].windowEnd == windows[j] {
					ents[j].held += b.Ops[j].Cost
				}
				ents[j].mu.Unlock()
			}
			return false
		}
	}
	return true
}

// awaited returns the grant in flight of the first op whose key lacks the units it costs,
// or nil when none of them waits for one.
func (s *Store) awaited(b *store.Batch, ents []*entry) chan struct{} {
	now := s.o.Now()
	for i := range b.Ops {
		e := ents[i]
		e.mu.Lock()
		short := !e.spendable(b.Ops[i].Params, now) || e.held < b.Ops[i].Cost
		ch := e.fetching
		e.mu.Unlock()
		if short && ch != nil {
			return ch
		}
	}
	return nil
}

// sharedCall is one request's call to the store: its ops as sent, and per op the held
// units it took off the cost, the grant it asked, the window those held units were in, and
// the grant channel it opened.
type sharedCall struct {
	b       store.Batch
	ops     [maxOps]store.Op
	at      [maxOps]int64
	taken   [maxOps]int64
	grants  [maxOps]int64
	windows [maxOps]int64
	opened  [maxOps]chan struct{}
}

var calls = sync.Pool{New: func() any { return new(sharedCall) }}

// adjustments are ops for Leaser.Adjust, each with the instant it names.
type adjustments struct {
	ops []store.Op
	at  []int64
}

func (a *adjustments) add(op store.Op, at int64) {
	a.ops, a.at = append(a.ops, op), append(a.at, at)
}

// applyShared has the store decide b. Each op asks its cost less the units its key holds (the
// store counted those already: on one node it then decides as if this node held none), plus
// a grant when its key is far from its limit and none is on its way. A request the store
// denies gives back nothing it took here; one whose grant may be what it was denied for is
// asked again without grants.
func (s *Store) applyShared(ctx context.Context, b *store.Batch, ents []*entry, results []algorithm.Result, grants bool) error {
	c := calls.Get().(*sharedCall)
	defer func() {
		*c = sharedCall{}
		calls.Put(c)
	}()
	n := len(b.Ops)
	send := s.o.Now()
	for i := range b.Ops {
		op, e := &b.Ops[i], ents[i]
		e.mu.Lock()
		if !sameLimit(e.params, op.Params) || send >= e.end {
			// Units of a window that may be over, or granted under another limit, are void
			// here: the store counts them, so this errs toward fewer admissions.
			e.held, e.params, e.remaining = 0, op.Params, -1
		}
		if send < e.end-s.guard {
			c.taken[i] = min(e.held, op.Cost)
			e.held -= c.taken[i]
		}
		c.windows[i] = e.windowEnd
		if g := s.grant(op.Params); grants && !e.dead && e.fetching == nil &&
			(e.remaining < 0 || e.remaining >= max(2*g, op.Params.Limit/4)+op.Cost) {
			c.grants[i] = g
			e.fetching = make(chan struct{})
			c.opened[i] = e.fetching
		}
		e.mu.Unlock()
		c.ops[i] = *op
		c.ops[i].Cost = op.Cost - c.taken[i] + c.grants[i]
	}
	c.b.Ops, c.b.OpAt = c.ops[:n], c.at[:n]
	_, err := s.inner.Apply(ctx, &c.b, results)
	allowed, retry := err == nil, false
	if err == nil {
		for i := range n {
			if !results[i].Allowed {
				allowed = false
				retry = retry || c.grants[i] > 0
			}
		}
	}
	var misplaced, back adjustments
	recv := s.o.Now()
	for i := range n {
		e := ents[i]
		e.mu.Lock()
		switch {
		case allowed:
			window := c.at[i] + results[i].ResetAfter
			if window != c.windows[i] && c.taken[i] > 0 {
				// The request reached the store in a window after the one its held units
				// were in: it was admitted for less than it costs there. Take the rest.
				misplaced.add(store.Op{Key: b.Ops[i].Key, Params: b.Ops[i].Params, Cost: -c.taken[i]}, c.at[i])
				results[i].Remaining = max(0, results[i].Remaining-c.taken[i])
			}
			if window > e.windowEnd {
				e.held, e.end = 0, 0
				e.windowEnd = window
			}
			if window == e.windowEnd {
				if c.grants[i] > 0 {
					e.held += c.grants[i]
					e.at = c.at[i]
					s.granted.Add(1)
				}
				e.end = max(e.end, send+results[i].ResetAfter)
				e.remaining = results[i].Remaining
				e.used = recv
			}
			// Else a request answered after another landed in a later window: its grant was
			// counted in a window that is over.
		default:
			// Nothing was consumed: the units taken off the cost are still counted, and
			// still this node's.
			switch {
			case c.taken[i] == 0 || e.windowEnd != c.windows[i]:
			case e.dead:
				// The sweep dropped the entry meanwhile (the request took long): no one
				// would spend or give them back.
				back.add(store.Op{Key: e.key, Params: e.params, Cost: c.taken[i]}, e.at)
			default:
				e.held += c.taken[i]
			}
			if err == nil {
				e.remaining = results[i].Remaining
			}
		}
		if c.opened[i] != nil {
			close(c.opened[i])
			e.fetching = nil
		}
		if err == nil {
			results[i].Remaining += e.held
		}
		e.mu.Unlock()
	}
	s.giveBack(ctx, &back)
	if err != nil {
		return err
	}
	if retry {
		return s.applyShared(ctx, b, ents, results, false)
	}
	// The request stands admitted whatever the take does: a take that fails leaves the new
	// window's count low by what it took off (at most its cost), which Stats counts.
	if len(misplaced.ops) > 0 && s.leaser.Adjust(ctx, misplaced.ops, misplaced.at) != nil {
		s.uncounted.Add(1)
	}
	return nil
}

// release gives back what the node holds on the keys of ops before the store decides them
// whole, so that it decides as it would alone.
func (s *Store) release(ctx context.Context, ops []store.Op) {
	var back adjustments
	now := s.o.Now()
	for i := range ops {
		if e := s.lookup(ops[i].Key); e != nil {
			e.mu.Lock()
			e.empty(now, &back)
			e.mu.Unlock()
		}
	}
	s.giveBack(ctx, &back)
}

// empty drops what e holds, adding its give-back to back if its window may still run (units
// of a window that ended count nowhere). e.mu is held.
func (e *entry) empty(now int64, back *adjustments) {
	if e.held > 0 && now < e.end {
		back.add(store.Op{Key: e.key, Params: e.params, Cost: e.held}, e.at)
	}
	e.held = 0
}

func (s *Store) giveBack(ctx context.Context, back *adjustments) {
	if len(back.ops) == 0 {
		return
	}
	// A give-back that fails leaves the units counted until their window ends: fewer
	// admissions, never more.
	if s.leaser.Adjust(ctx, back.ops, back.at) == nil {
		s.givenBack.Add(int64(len(back.ops)))
	}
}

// sweep gives back the units unspent for Idle and drops the entries idle for longer.
func (s *Store) sweep(ctx context.Context) {
	now := s.o.Now()
	idle := s.o.Idle.Microseconds()
	var back adjustments
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.entries {
			e.mu.Lock()
			if quiet := now-e.used >= idle; quiet {
				e.empty(now, &back)
				if e.fetching == nil && (now-e.used >= 2*idle || now >= e.end) {
					e.dead = true
					delete(sh.entries, k)
				}
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	s.giveBack(ctx, &back)
}

func (s *Store) loop() {
	defer s.done.Done()
	t := time.NewTicker(s.o.Idle / 4)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.sweep(ctx)
			cancel()
		}
	}
}

// Reset drops what the node holds on keys, which the store forgets, and resets them there.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	for _, k := range keys {
		if e := s.lookup(k); e != nil {
			e.mu.Lock()
			e.held, e.remaining, e.end = 0, -1, 0
			e.mu.Unlock()
		}
	}
	return s.inner.Reset(ctx, keys)
}

// Close stops the sweep, gives back every unit held, and closes the store.
func (s *Store) Close() error {
	close(s.stop)
	s.done.Wait()
	var back adjustments
	now := s.o.Now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.entries {
			e.mu.Lock()
			e.empty(now, &back)
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.giveBack(ctx, &back)
	cancel()
	return s.inner.Close()
}

// Stats counts what allowances decided.
type Stats struct {
	Local, Shared, Grants, GivenBack int64
	// Uncounted is the requests admitted across a window's turn whose take in the new
	// window failed (see applyShared).
	Uncounted int64
}

// Stats returns the requests decided from held units and by the store, the grants taken, the
// give-backs sent, and the admissions counted short.
func (s *Store) Stats() Stats {
	return Stats{Local: s.local.Load(), Shared: s.shared.Load(), Grants: s.granted.Load(),
		GivenBack: s.givenBack.Load(), Uncounted: s.uncounted.Load()}
}

// Ping asks the shared store: held units do not make a node ready while it is down.
func (s *Store) Ping(ctx context.Context) error { return store.Ping(ctx, s.inner) }

// PutLease passes to the store that keeps leases (store.Leaser).
func (s *Store) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	return s.leaser.PutLease(ctx, id, rec, ttl)
}

// SettleLease passes to the store that keeps leases (store.Leaser).
func (s *Store) SettleLease(ctx context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	return s.leaser.SettleLease(ctx, id, used)
}

// RenewLease passes to the store that keeps leases (store.Leaser).
func (s *Store) RenewLease(ctx context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	return s.leaser.RenewLease(ctx, id, ttl)
}

// Adjust settles a reservation in the store, which decided it (reservations bypass
// allowances: Batch.Lease).
func (s *Store) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	return s.leaser.Adjust(ctx, ops, at)
}
