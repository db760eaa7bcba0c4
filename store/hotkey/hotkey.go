// Package hotkey spares a shared store its hottest keys. Each node finds its hottest keys over
// a short interval with a Space-Saving top-k sketch (fixed memory, no timestamps per key).
// Requests on a hot key are decided in the process against the quota the store reported at the
// last sync, and the summed hits go back to the store in one batch every sync interval (50 ms),
// which also reads the shared state back.
//
// The price is a bounded overage. Between syncs a node admits at most its share (1/Nodes) of
// what the store last reported as remaining, and never more than Overage (default 5%) of the
// limit's capacity divided by Nodes; so the fleet stays within the store's remaining while
// Nodes is right, and within Overage above the bound if it is not. Below one unit per node the
// key waits for the next sync, erring toward fewer admissions.
package hotkey

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/sketch"
	"github.com/sluicehq/sluice/store"
)

// Options tune hot-key mode; zero values take the defaults.
type Options struct {
	// Threshold is the requests per second on one node that make a key hot (default 500).
	Threshold int
	// Overage is the share of a limit the fleet may admit beyond the exact bound (default 0.05).
	Overage float64
	// Nodes is the expected number of Sluice nodes sharing the store (default 1).
	Nodes int
	// SyncEvery is how often local hits are written back (default 50 ms).
	SyncEvery time.Duration
	// Detect is the detection interval (default 1 s).
	Detect time.Duration
}

// Store decides hot keys locally and passes everything else to the shared store.
type Store struct {
	inner store.Store
	o     Options

	sketch  *sketch.SpaceSaving
	sampled atomic.Uint32

	mu      sync.RWMutex
	hot     map[string]*hotKey
	syncMu  sync.Mutex  // held through a sync
	closing atomic.Bool // the last sync: it writes in-flight takes too

	local, mixed, synced atomic.Int64 // requests decided locally, and in part; sync calls made

	stop chan struct{}
	done sync.WaitGroup
}

// hotKey is the local view of one hot key between syncs.
type hotKey struct {
	mu        sync.Mutex
	key       []byte
	params    algorithm.Params
	remaining int64 // what the store reported at the last sync
	cap       int64 // the most this node may hold admitted but not yet in the store
	budget    int64 // what this node may admit until the next sync: min(cap, remaining/nodes)
	pending   int64 // admitted here since the last sync, not yet in the store
	inflight  int64 // of pending, what mixed batches took and have not settled: not written yet
	reset     int64 // reset_after at the last sync, µs
	retry     int64 // retry_after when the store was spent at the last sync, µs
	syncEvery int64 // µs
	ready     bool  // synced at least once with the current params: decisions can be local
	retiring  bool  // asked for below half the threshold: the store decides until the hits are written
}

// New wraps inner. Close stops the background sync and writes back what is pending.
func New(inner store.Store, o Options) *Store {
	s := newStore(inner, o)
	s.done.Add(1)
	go s.loop()
	return s
}

// newStore is New without the background loop: tests that call detect and sync themselves
// use it, so that a loop's tick on a slow machine does not come between their steps.
func newStore(inner store.Store, o Options) *Store {
	if o.Threshold <= 0 {
		o.Threshold = 500
	}
	if o.Overage <= 0 {
		o.Overage = 0.05
	}
	if o.Nodes <= 0 {
		o.Nodes = 1
	}
	if o.SyncEvery <= 0 {
		o.SyncEvery = 50 * time.Millisecond
	}
	if o.Detect <= 0 {
		o.Detect = time.Second
	}
	return &Store{inner: inner, o: o, sketch: sketch.New(sketchCounters), hot: map[string]*hotKey{}, stop: make(chan struct{})}
}

// sketchCounters is the detection sketch's size. Space-Saving keeps every key seen more than
// n/k times of the n keys it is fed, so a key above the threshold must stand above n/k among a
// node's cold keys: fewer counters lost a tenant at twice the threshold among many new users'
// requests (TestDetectAmongManyColdKeys). A counter costs about a hundred bytes with its key,
// and placing a key costs O(log k), on one request in sampleEvery (docs/measurements.md).
const sketchCounters = 1024

// sampleEvery is how many requests pass per one whose keys are counted in the sketch:
// detection needs the heavy hitters, not exact counts, and sampling keeps the sketch's lock off
// most requests. A request, not a key: counting every 8th key of requests of 4 or 8 limits
// would count the same limit's key every time.
const sampleEvery = 8

// maxLocalOps is the most limits a request decided locally may have; a request under more
// goes to the store (its hot keys' lookups use an array on the stack).
const maxLocalOps = 8

// Apply decides a batch whose every op is on a ready hot key locally, all or nothing as the
// store would; b.HotKey is set then. A batch with some ops on ready hot keys (a user's limit
// beside a global or an endpoint's one) takes its hot ops locally and sends only the others
// to the store (applyMixed), unless a hot op is denied. Anything else goes to the store whole,
// and what it answers about a lone hot key is learnt.
func (s *Store) Apply(ctx context.Context, b *store.Batch, results []algorithm.Result) (bool, error) {
	// A reservation goes to the store whole: its settlement gives back there, and must not
	// give back what a local decision never took from it.
	if b.Lease || len(b.IdempotencyKey) > 0 || len(b.Ops) == 0 || len(b.Ops) > maxLocalOps {
		return s.inner.Apply(ctx, b, results)
	}
	if s.sampled.Add(1)%sampleEvery == 0 {
		for i := range b.Ops {
			// A concurrency key is never hot: its slots are leases only the store holds.
			if b.Ops[i].Params.Kind != algorithm.Concurrency {
				s.sketch.Add(b.Ops[i].Key)
			}
		}
	}
	var hot [maxLocalOps]*hotKey
	found, all := false, true
	// The read lock is held through the decision: a sync counts the hits (under the write
	// lock) before or after a local decision, never between one op's take and its give-back.
	// A mixed batch's takes outlive the lock, as in flight, until the store has answered.
	s.mu.RLock()
	for i := range b.Ops {
		h := s.hot[string(b.Ops[i].Key)]
		hot[i] = h
		found, all = found || h != nil, all && h != nil
	}
	local, mixed := false, false
	if found {
		taken, denied := decideHot(b, hot[:len(b.Ops)], results)
		switch {
		case taken && all:
			if denied {
				giveBack(b, hot[:len(b.Ops)], results, false)
			}
			local = true
		case taken && denied:
			// The store decides the whole batch: it must be asked about the other ops anyway,
			// in the same round trip, and only it can tell each of their verdicts (a shadow
			// limit's, a retry) without consuming them. Counters too: it counts them.
			giveBack(b, hot[:len(b.Ops)], results, true)
		case taken:
			markInflight(b, hot[:len(b.Ops)], results)
			mixed = true
		}
	}
	s.mu.RUnlock()
	if local {
		b.HotKey = true
		s.local.Add(1)
		return false, nil
	}
	if mixed {
		return false, s.applyMixed(ctx, b, hot[:len(b.Ops)], results)
	}
	replayed, err := s.inner.Apply(ctx, b, results)
	// Only a lone op's result is surely the store's word on its key: a request of several that
	// a Cluster denied in one slot and failed to refund in another reports stand-ins for the
	// ops it could not look at again.
	if err == nil && found && len(b.Ops) == 1 {
		hot[0].learn(b.Ops[0].Params, &results[0])
	}
	return replayed, err
}

// decideHot decides the ops of b on hot keys (hot[i] != nil) locally, taking what each
// admits, and reports whether a binding one was denied: the caller then gives back as the
// store would (giveBack). It reports taken false, having taken nothing, when a key must ask
// the store (see hotKey.decide).
func decideHot(b *store.Batch, hot []*hotKey, results []algorithm.Result) (taken, denied bool) {
	for i := range b.Ops {
		if hot[i] == nil {
			continue
		}
		op := &b.Ops[i]
		r, ok := hot[i].decide(op.Params, op.Cost, op.Binding())
		if !ok {
			giveBack(b, hot[:i], results, true)
			return false, false
		}
		results[i] = r
		if !r.Allowed && op.Binding() {
			denied = true
		}
	}
	return true, denied
}

// giveBack returns what the ops of b on the first len(hot) keys admitted (hot[i] nil is an op
// the store decides), the counters' too when counters is set, and then reports what each of
// those ops has left: after every give-back, since two ops of a batch may share a key. A
// denied batch takes nothing from its other limits, but its counters keep what they counted.
func giveBack(b *store.Batch, hot []*hotKey, results []algorithm.Result, counters bool) {
	back := func(i int) bool {
		op := &b.Ops[i]
		return hot[i] != nil && results[i].Allowed && op.Cost > 0 && (counters || !op.Counter)
	}
	for i, h := range hot {
		if back(i) {
			h.giveBack(b.Ops[i].Cost)
		}
	}
	for i, h := range hot {
		if back(i) {
			results[i].Remaining = h.left()
		}
	}
}

// markInflight counts the takes of a mixed batch's hot ops as in flight: no sync writes them
// until the store's answer settles them (settle).
func markInflight(b *store.Batch, hot []*hotKey, results []algorithm.Result) {
	for i, h := range hot {
		if h != nil && results[i].Allowed && b.Ops[i].Cost > 0 {
			h.mu.Lock()
			h.inflight += b.Ops[i].Cost
			h.mu.Unlock()
		}
	}
}

// settle ends the in-flight takes of a mixed batch's hot ops: every take leaves inflight, and
// the counters' (when counters is set) and the others' (when others is) are given back; each
// given back then reports what its key has left.
func settle(b *store.Batch, hot []*hotKey, results []algorithm.Result, counters, others bool) {
	back := func(i int) bool {
		if b.Ops[i].Counter {
			return counters
		}
		return others
	}
	for i, h := range hot {
		if h != nil && results[i].Allowed && b.Ops[i].Cost > 0 {
			h.mu.Lock()
			h.inflight -= b.Ops[i].Cost
			if back(i) {
				h.pending -= b.Ops[i].Cost
			}
			h.mu.Unlock()
		}
	}
	for i, h := range hot {
		if h != nil && results[i].Allowed && b.Ops[i].Cost > 0 && back(i) {
			results[i].Remaining = h.left()
		}
	}
}

// coldPart is the store's part of a batch some of whose ops are on hot keys. It is pooled:
// a store never touches a batch once its Apply returned.
type coldPart struct {
	batch store.Batch
	ops   [maxLocalOps]store.Op
	res   [maxLocalOps]algorithm.Result
	at    [maxLocalOps]int // the index in the whole batch of each of ops
}

var coldParts = sync.Pool{New: func() any { return new(coldPart) }}

// applyMixed sends the ops of b not on hot keys to the store, the hot ones having been taken
// locally (decideHot, allowed; markInflight), and makes the batch all or nothing as the store
// would: when the store denies its part, the hot ops give back what they took but for
// counters; when it fails, they give back everything (the request was not decided). No lock
// is held across the round trip; the takes are in flight meanwhile, so a sync writes none
// of them before it is known whether it stands.
func (s *Store) applyMixed(ctx context.Context, b *store.Batch, hot []*hotKey, results []algorithm.Result) error {
	cp := coldParts.Get().(*coldPart)
	n := 0
	for i := range b.Ops {
		if hot[i] == nil {
			cp.ops[n], cp.at[n] = b.Ops[i], i
			n++
		}
	}
	cp.batch.Ops = cp.ops[:n]
	_, err := s.inner.Apply(ctx, &cp.batch, cp.res[:n])
	denied := false
	if err == nil {
		for j := range n {
			results[cp.at[j]] = cp.res[j]
			denied = denied || !cp.res[j].Allowed && cp.ops[j].Binding()
		}
	}
	clear(cp.ops[:n]) // the pool holds no request's keys
	cp.batch = store.Batch{}
	coldParts.Put(cp)
	settle(b, hot, results, err != nil, err != nil || denied)
	if err != nil {
		return err
	}
	s.mixed.Add(1)
	return nil
}

// learn takes in what the store answered a request this node sent it for a hot key: what is
// left, and whether it is spent, so that the next requests need not ask again.
func (h *hotKey) learn(p *algorithm.Params, r *algorithm.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.params != *p || !h.ready {
		return
	}
	h.remaining = min(h.remaining, r.Remaining+h.pending)
	if !r.Allowed && r.Reason == algorithm.ReasonNone {
		h.remaining, h.retry = h.pending, max(r.RetryAfter, 1)
	}
}

// decide admits cost locally. It reports false, to send the request to the store, until a
// sync has read the store with these parameters (a new hot key, or a changed limit), and
// when a shadow or counter op (binding false) is out of this node's share while the store has
// room: the store would admit it, and a counter must count every request, a shadow limit
// deny only what it would deny.
func (h *hotKey) decide(p *algorithm.Params, cost int64, binding bool) (algorithm.Result, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.params != *p {
		h.params, h.ready = *p, false
	}
	if !h.ready || h.retiring {
		return algorithm.Result{}, false
	}
	r := algorithm.Result{ResetAfter: h.reset}
	switch {
	case cost == 0: // a look is always allowed
		r.Allowed = true
	case cost > h.params.Capacity():
		r.Reason = algorithm.ReasonCostExceedsCapacity
	case h.budget == 0 && h.pending+cost <= h.remaining:
		// Less is left than one unit per node: let the store decide this one exactly,
		// rather than every node waiting for a share that rounds to nothing.
		return algorithm.Result{}, false
	case h.pending+cost <= h.budget:
		// Each node spends only its share of what the store last reported, and never more
		// than cap unknown to the store: that is what bounds the fleet's overage.
		r.Allowed = true
		h.pending += cost
	case h.pending+cost <= h.remaining:
		if !binding {
			return algorithm.Result{}, false
		}
		// This node's share is out until the next sync writes it back.
		r.RetryAfter = max(1, h.syncEvery)
	default:
		// Spent, as the store said at the last sync.
		r.RetryAfter = max(h.retry, 1)
	}
	r.Remaining = max(0, h.remaining-h.pending)
	return r, true
}

// giveBack returns cost admitted by decide.
func (h *hotKey) giveBack(cost int64) {
	h.mu.Lock()
	h.pending -= cost
	h.mu.Unlock()
}

// left is what the key has left to admit, as decide reports it.
func (h *hotKey) left() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(0, h.remaining-h.pending)
}

// Reset passes through, and drops the local view of the keys.
func (s *Store) Reset(ctx context.Context, keys [][]byte) error {
	s.mu.Lock()
	for _, k := range keys {
		delete(s.hot, string(k))
	}
	s.mu.Unlock()
	return s.inner.Reset(ctx, keys)
}

// Close syncs what is pending and closes the store.
func (s *Store) Close() error {
	close(s.stop)
	s.done.Wait()
	s.closing.Store(true)
	s.sync(context.Background())
	return s.inner.Close()
}

// Stats are hot-key mode's figures.
type Stats struct {
	Hot   int   // keys now hot, less those retiring (whose requests already go to the store)
	Local int64 // requests decided in the process
	Mixed int64 // requests whose hot limits were decided in the process, the others by the store
	Syncs int64 // store calls made to write hot keys' hits back
}

// Stats reports hot-key mode's figures, for metrics and tests.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	hot := 0
	for _, h := range s.hot {
		h.mu.Lock()
		if !h.retiring {
			hot++
		}
		h.mu.Unlock()
	}
	return Stats{Hot: hot, Local: s.local.Load(), Mixed: s.mixed.Load(), Syncs: s.synced.Load()}
}

func (s *Store) loop() {
	defer s.done.Done()
	syncT := time.NewTicker(s.o.SyncEvery)
	detectT := time.NewTicker(s.o.Detect)
	defer syncT.Stop()
	defer detectT.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-syncT.C:
			s.sync(context.Background())
		case <-detectT.C:
			s.detect()
		}
	}
}

// detect promotes the keys the sketch saw above the threshold and retires hot keys asked for
// less than half of it during the interval: nobody's, and those that cooled or were promoted by
// a burst. Half, not the threshold itself, so that a key near it is not moved back and forth by
// sampling noise (below 2 samples of promotion per interval, Threshold × Detect < 16, half
// rounds to the same 1). A retiring key's requests go to the store, and it goes once a sync
// has written its hits; asked for again above half, it is decided locally again.
func (s *Store) detect() {
	promoteAt := max(1, int64(float64(s.o.Threshold)*s.o.Detect.Seconds()/sampleEvery))
	counted := s.sketch.Drain(max(1, promoteAt/2))
	keep := make(map[string]bool, len(counted))
	for _, c := range counted {
		keep[c.Key] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Under the write lock no request is between finding a key and deciding on it (see Apply),
	// so one removed here is never decided on again.
	for k, h := range s.hot {
		h.mu.Lock()
		h.retiring = !keep[k]
		gone := h.retiring && h.pending == 0
		h.mu.Unlock()
		if gone {
			delete(s.hot, k)
		}
	}
	for _, c := range counted {
		if c.Count-c.Err >= promoteAt && s.hot[c.Key] == nil {
			// Its parameters come with its next request; until a sync has read the store,
			// its requests still go there.
			s.hot[c.Key] = &hotKey{key: []byte(c.Key)}
		}
	}
}

// sync writes the hot keys' pending hits back and reads their state: one batch that looks at
// every hot key (a look costs nothing, so one key cannot deny another), then a take per key
// with hits pending, of what fits. Hits admitted beyond what was left are the bounded overage.
func (s *Store) sync(ctx context.Context) {
	// One at a time (the loop's, Promote's, Close's): two would write the same hits.
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	var ready []*hotKey
	var params []algorithm.Params
	var pendings []int64
	// The write lock: no local decision is halfway (see Apply), and a mixed batch's takes are
	// in flight until the store answers it, so the hits counted here are whole requests',
	// none of which will be given back.
	s.mu.Lock()
	for _, h := range s.hot {
		h.mu.Lock()
		if h.params.Kind != 0 { // no request has told the parameters of a new key yet
			// In-flight takes wait for their batch's answer: one given back was never a hit.
			// The last sync (Close) writes them: there is no later one, and a request
			// still in flight then (a shutdown that gave up draining) is likelier to stand
			// (its give-back, if any, then leaves pending below in flight: nothing syncs).
			pending := h.pending - h.inflight
			if s.closing.Load() {
				pending = h.pending
			}
			ready, params, pendings = append(ready, h), append(params, h.params), append(pendings, pending)
		}
		h.mu.Unlock()
	}
	s.mu.Unlock()
	if len(ready) == 0 {
		return
	}
	look := &store.Batch{Ops: make([]store.Op, len(ready))}
	for i, h := range ready {
		look.Ops[i] = store.Op{Key: h.key, Params: &params[i]}
	}
	seen := make([]algorithm.Result, len(ready))
	if _, err := s.inner.Apply(ctx, look, seen); err != nil {
		return // keep the pending hits for the next sync
	}
	s.synced.Add(1)
	// The keys are written back side by side, each its own batch (a batch is all or nothing:
	// one key's refusal must not refuse another's hits), so that a store that coalesces
	// concurrent calls (store/redis) sends a few calls a sync rather than one per hot key.
	var wg sync.WaitGroup
	slots := make(chan struct{}, writeBackConcurrency)
	for i, h := range ready {
		if pendings[i] <= 0 {
			s.syncKey(ctx, h, &params[i], 0, seen[i]) // nothing to write: no call
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			s.syncKey(ctx, h, &params[i], pendings[i], seen[i])
		})
	}
	wg.Wait()
}

// writeBackConcurrency bounds the keys a sync writes back at once.
const writeBackConcurrency = 64

// syncKey writes h's pending hits back (writeBack), seen holding its look, and takes in what
// the store reports.
func (s *Store) syncKey(ctx context.Context, h *hotKey, p *algorithm.Params, pending int64, seen algorithm.Result) {
	res := []algorithm.Result{seen}
	done, ok := s.writeBack(ctx, h, p, pending, res)
	h.mu.Lock()
	// What was written is off pending even when the parameters changed meanwhile: left
	// there, the next sync would write it again.
	h.pending -= done
	if ok && h.params == *p {
		h.ready = true
		h.remaining = res[0].Remaining
		h.reset, h.retry = res[0].ResetAfter, res[0].RetryAfter
		if h.remaining == 0 && h.retry == 0 {
			h.retry = res[0].ResetAfter
		}
		h.cap = max(1, int64(math.Floor(s.o.Overage*float64(p.Capacity())/float64(s.o.Nodes))))
		// The nodes share what is left: each spending all of it would over-admit by the
		// number of nodes at every sync of a refilling bucket.
		h.budget = min(h.cap, h.remaining/int64(s.o.Nodes))
		h.syncEvery = s.o.SyncEvery.Microseconds()
	}
	h.mu.Unlock()
}

// writeBack consumes what fits of pending hits, res[0] holding the key's last look. Another
// node may take from the key between the look and the take, and the store admits all of a take
// or none of it: on a denial it takes what the store says is left, so that only hits beyond the
// store's capacity stay unrecorded. It returns how many of the hits are done with, written or
// beyond what the store had (the bounded overage); the others stay pending for the next sync
// (the store kept being taken from, or failed: ok false).
func (s *Store) writeBack(ctx context.Context, h *hotKey, p *algorithm.Params, pending int64, res []algorithm.Result) (done int64, ok bool) {
	for attempt := 0; attempt < 4; attempt++ {
		take := min(pending-done, res[0].Remaining)
		if take <= 0 {
			return pending, true // written, or the store is spent: the rest is the overage
		}
		b := &store.Batch{Ops: []store.Op{{Key: h.key, Params: p, Cost: take}}}
		if _, err := s.inner.Apply(ctx, b, res); err != nil {
			return done, false
		}
		s.synced.Add(1)
		if res[0].Allowed {
			done += take
		}
	}
	return done, true
}

// Promote makes k hot with params at once, for tests and for keys an operator knows are hot.
// A key already hot keeps its pending hits. Detection retires a promoted key as any other once
// it is asked for below half the threshold in an interval.
func (s *Store) Promote(k []byte, params algorithm.Params) {
	s.mu.Lock()
	h := s.hot[string(k)]
	if h == nil {
		h = &hotKey{key: append([]byte(nil), k...)}
		s.hot[string(k)] = h
	}
	h.mu.Lock()
	if h.params != params {
		h.params, h.ready = params, false
	}
	h.retiring = false
	h.mu.Unlock()
	s.mu.Unlock()
	s.sync(context.Background())
}
