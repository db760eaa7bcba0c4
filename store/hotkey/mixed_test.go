package hotkey

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// keyedStore passes batches to a store and records the keys of each. A batch holding the key
// hook runs before (with the batch) first when it is set, and fails instead of reaching the
// store when fail is.
type keyedStore struct {
	store.Store
	hook string

	mu      sync.Mutex
	batches [][]string
	before  func(*store.Batch)
	fail    bool
	ops     map[string]int64 // ops per key
}

func (k *keyedStore) Apply(ctx context.Context, b *store.Batch, res []algorithm.Result) (bool, error) {
	keys := make([]string, len(b.Ops))
	hooked := false
	for i := range b.Ops {
		keys[i] = string(b.Ops[i].Key)
		hooked = hooked || keys[i] == k.hook
	}
	k.mu.Lock()
	k.batches = append(k.batches, keys)
	if k.ops == nil {
		k.ops = map[string]int64{}
	}
	for _, key := range keys {
		k.ops[key]++
	}
	before, fail := k.before, k.fail
	k.mu.Unlock()
	if hooked && before != nil {
		before(b)
	}
	if hooked && fail {
		return false, errors.New("store down")
	}
	return k.Store.Apply(ctx, b, res)
}

func (k *keyedStore) last() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.batches[len(k.batches)-1]
}

func (k *keyedStore) set(before func(*store.Batch), fail bool) {
	k.mu.Lock()
	k.before, k.fail = before, fail
	k.mu.Unlock()
}

func (k *keyedStore) opsOn(key string) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ops[key]
}

// mixedFixture is a hot-key store over a memory store at a fixed instant, with the keys hot
// promoted (SyncEvery and Detect an hour: syncs happen when the test says).
func mixedFixture(t *testing.T, hook string, hot map[string]algorithm.Params) (*Store, *keyedStore, *memory.Store) {
	t.Helper()
	now := int64(1_700_000_000_000_000)
	shared := memory.New(memory.WithClock(func() int64 { return now }), memory.WithSweepInterval(0))
	ks := &keyedStore{Store: shared, hook: hook}
	h := New(ks, Options{SyncEvery: time.Hour, Detect: time.Hour})
	t.Cleanup(func() { h.Close() })
	for k, p := range hot {
		h.Promote([]byte(k), p)
	}
	return h, ks, shared
}

// counted returns what the store counted on key under params.
func counted(t *testing.T, st store.Store, key string, p *algorithm.Params) int64 {
	t.Helper()
	res := make([]algorithm.Result, 1)
	if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: []byte(key), Params: p}}}, res); err != nil {
		t.Fatal(err)
	}
	return p.Limit - res[0].Remaining
}

// wantCount is what the store should have counted on a key.
type wantCount struct {
	key    string
	params *algorithm.Params
	want   int64
}

// syncCounts syncs h and checks what the store counted on each key.
func syncCounts(t *testing.T, h *Store, shared store.Store, counts ...wantCount) {
	t.Helper()
	h.sync(ctx)
	for _, c := range counts {
		if got := counted(t, shared, c.key, c.params); got != c.want {
			t.Errorf("%s: the store counted %d, want %d", c.key, got, c.want)
		}
	}
}

// allowedAll reports whether every binding op of ops was allowed.
func allowedAll(ops []store.Op, res []algorithm.Result) bool {
	for i := range res {
		if !res[i].Allowed && ops[i].Binding() {
			return false
		}
	}
	return true
}

// TestMixedBatch: a user's limit (not hot) beside a global limit and a counter (hot). Only the
// user's op reaches the store; when the store denies it, the global limit takes nothing and the
// counter keeps its count, as the store would have decided the whole batch; the syncs write
// exactly what was admitted.
func TestMixedBatch(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	user, _ := algorithm.NewParams(algorithm.FixedWindow, 2, 0, longWindow)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"global": wide, "count": wide})
	ops := []store.Op{
		{Key: []byte("user"), Params: &user, Cost: 1},
		{Key: []byte("global"), Params: &wide, Cost: 1},
		{Key: []byte("count"), Params: &wide, Cost: 1, Counter: true},
	}
	for i, want := range []bool{true, true, false} {
		b := &store.Batch{Ops: ops}
		res := make([]algorithm.Result, len(ops))
		if _, err := h.Apply(ctx, b, res); err != nil {
			t.Fatal(err)
		}
		if got := allowedAll(ops, res); got != want {
			t.Fatalf("request %d: allowed %v, want %v (%+v)", i, got, want, res)
		}
		if b.HotKey {
			t.Errorf("request %d: marked local, but the store decided the user's limit", i)
		}
		if keys := ks.last(); !slices.Equal(keys, []string{"user"}) {
			t.Errorf("request %d: the store saw %v, want only the user's key", i, keys)
		}
		if !want && (res[1].Remaining != 998 || !res[2].Allowed || res[0].Allowed) {
			t.Errorf("denied request: global has %d left (want 998: nothing taken), counter allowed %v, user allowed %v", res[1].Remaining, res[2].Allowed, res[0].Allowed)
		}
	}
	if st := h.Stats(); st.Mixed != 3 || st.Local != 0 {
		t.Errorf("stats %+v, want 3 mixed and 0 local decisions", st)
	}
	syncCounts(t, h, shared, wantCount{"user", &user, 2}, wantCount{"global", &wide, 2}, wantCount{"count", &wide, 3})
}

// TestMixedHotDenialAsksTheStore: when a hot limit is out of this node's share, the request
// needs the store anyway (for its other limits), so the store decides the whole of it; the
// hot takes are given back first, a sibling hot limit's and a counter's too (the store counts
// the counter), and the store's counts after the sync are what was admitted.
func TestMixedHotDenialAsksTheStore(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	tight, _ := algorithm.NewParams(algorithm.FixedWindow, 40, 0, longWindow) // a share of 2 (5%)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"wide": wide, "count": wide, "tight": tight})
	ops := []store.Op{
		{Key: []byte("user"), Params: &wide, Cost: 1},
		{Key: []byte("wide"), Params: &wide, Cost: 1},
		{Key: []byte("count"), Params: &wide, Cost: 1, Counter: true},
		{Key: []byte("tight"), Params: &tight, Cost: 1},
	}
	for i, whole := range []bool{false, false, true} {
		res := make([]algorithm.Result, len(ops))
		if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
			t.Fatal(err)
		}
		if !allowedAll(ops, res) {
			t.Fatalf("request %d denied (%+v); the store has room", i, res)
		}
		want := []string{"user"}
		if whole {
			want = []string{"user", "wide", "count", "tight"}
		}
		if keys := ks.last(); !slices.Equal(keys, want) {
			t.Errorf("request %d: the store saw %v, want %v", i, keys, want)
		}
	}
	syncCounts(t, h, shared, wantCount{"user", &wide, 3}, wantCount{"wide", &wide, 3}, wantCount{"count", &wide, 3}, wantCount{"tight", &tight, 3})
}

// TestMixedNotReadyGoesWhole: a hot key asked with other parameters than it was synced with
// (a changed limit) must ask the store: the batch goes there whole, and a hot counter taken
// before the key was found not ready gives its take back (the store counts it).
func TestMixedNotReadyGoesWhole(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	changed, _ := algorithm.NewParams(algorithm.FixedWindow, 2000, 0, longWindow)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"count": wide, "global": wide})
	ops := []store.Op{
		{Key: []byte("count"), Params: &wide, Cost: 1, Counter: true},
		{Key: []byte("user"), Params: &wide, Cost: 1},
		{Key: []byte("global"), Params: &changed, Cost: 1},
	}
	res := make([]algorithm.Result, len(ops))
	if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
		t.Fatal(err)
	}
	if keys := ks.last(); !slices.Equal(keys, []string{"count", "user", "global"}) {
		t.Errorf("the store saw %v, want the whole batch", keys)
	}
	syncCounts(t, h, shared, wantCount{"count", &wide, 1}) // the store's own count only
}

// TestMixedShadow: a shadow limit on the store that would deny does not deny the request, so
// the hot takes stand.
func TestMixedShadow(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	one, _ := algorithm.NewParams(algorithm.FixedWindow, 1, 0, longWindow)
	h, _, shared := mixedFixture(t, "user", map[string]algorithm.Params{"global": wide})
	ops := []store.Op{{Key: []byte("user"), Params: &one, Cost: 1, Shadow: true}, {Key: []byte("global"), Params: &wide, Cost: 1}}
	for i := range 2 {
		res := make([]algorithm.Result, len(ops))
		if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
			t.Fatal(err)
		}
		if !allowedAll(ops, res) || res[0].Allowed != (i == 0) {
			t.Fatalf("request %d: %+v; want allowed, the shadow limit denying the second", i, res)
		}
	}
	syncCounts(t, h, shared, wantCount{"global", &wide, 2})
}

// TestMixedStoreFailureTakesNothing: when the store fails the cold part, the request was not
// decided, so the hot ops give back everything, counters too.
func TestMixedStoreFailureTakesNothing(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"global": wide, "count": wide})
	ks.set(nil, true)
	ops := []store.Op{
		{Key: []byte("user"), Params: &wide, Cost: 1},
		{Key: []byte("global"), Params: &wide, Cost: 1},
		{Key: []byte("count"), Params: &wide, Cost: 1, Counter: true},
	}
	if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, make([]algorithm.Result, len(ops))); err == nil {
		t.Fatal("the store failed, Apply did not")
	}
	ks.set(nil, false)
	for _, key := range []string{"global", "count"} {
		hk := h.hot[key]
		if hk.pending != 0 || hk.inflight != 0 {
			t.Errorf("%s: %d pending, %d in flight after a failed request, want none", key, hk.pending, hk.inflight)
		}
	}
	h.sync(ctx)
	for _, key := range []string{"global", "count"} {
		if got := counted(t, shared, key, &wide); got != 0 {
			t.Errorf("%s: the store counted %d after a failed request, want 0", key, got)
		}
	}
}

// TestMixedGiveBackAfterSync: a sync runs while a request's other limit is in the store,
// which then denies it. The request's hot take is in flight meanwhile, so the sync does not
// write it, and its give-back leaves the store's count exact.
func TestMixedGiveBackAfterSync(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	one, _ := algorithm.NewParams(algorithm.FixedWindow, 1, 0, longWindow)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"global": wide})
	apply := func(user string) bool {
		t.Helper()
		ops := []store.Op{{Key: []byte(user), Params: &one, Cost: 1}, {Key: []byte("global"), Params: &wide, Cost: 1}}
		res := make([]algorithm.Result, len(ops))
		if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
			t.Fatal(err)
		}
		return allowedAll(ops, res)
	}
	ks.set(func(*store.Batch) { h.sync(ctx) }, false) // the sync runs while the user's limit is in the store
	if !apply("user") || apply("user") {
		t.Fatal("want the first request allowed and the second denied (the user's limit is 1)")
	}
	ks.set(nil, false)
	if got := counted(t, shared, "global", &wide); got != 1 {
		t.Fatalf("global: the store counted %d, want 1 (the denied request's take was in flight)", got)
	}
	h.sync(ctx)
	if !apply("user2") {
		t.Fatal("a fresh user's request was denied")
	}
	h.sync(ctx)
	if got := counted(t, shared, "global", &wide); got != 2 {
		t.Errorf("global: the store counted %d, want the 2 admitted requests", got)
	}
}

// mixedOverage is mixedHammer's hot-key overage: 0.5%, so that the bound (the limit and each
// node's cap) is tighter than what a node's speed alone keeps it to.
const mixedOverage = 0.005

// mixedHotRequests is how many requests a run without untilBound sends once the global key
// is hot, at least.
const mixedHotRequests = 5000

// mixedPastBound is how many requests an untilBound run sends past the bound at least.
const mixedPastBound = 2000

// mixedBoundCap is how long mixedHammer's untilBound run may take to reach the bound.
const mixedBoundCap = 2 * time.Minute

// mixedRun is what mixedHammer measured.
type mixedRun struct {
	requests, admitted, mixed, local int64
	hotOps, hotRequests              int64         // the global key's store ops and the requests from 300 ms on
	hotFor                           time.Duration // from 300 ms to the end or the bound
	usersCounted                     int64
}

// mixedHammer sends requests of 2 nodes (8 goroutines each) under a user's limit (20,000 users,
// none near the threshold of a hot key) and a global limit of global's, on the Redis srv, for
// two seconds and mixedHotRequests requests once the global key is hot, or with untilBound for one and until the global bound is reached, half a second
// and mixedPastBound requests more (to catch any overage). It counts the global key's store ops from 300 ms on (once it is hot)
// and what the users' limits counted.
func mixedHammer(t *testing.T, srv *redistest.Server, global algorithm.Params, untilBound bool) mixedRun {
	t.Helper()
	perUser, _ := algorithm.NewParams(algorithm.FixedWindow, 1_000_000, 0, longWindow)
	const users = 20_000
	prefix := "user-" + strconv.FormatInt(global.Limit, 10) + "-"
	inners := make([]*keyedStore, 2)
	nodes := make([]*Store, 2)
	for i := range nodes {
		r, err := redis.New(ctx, "redis://"+srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		inners[i] = &keyedStore{Store: r}
		nodes[i] = New(inners[i], Options{Threshold: 200, Nodes: 2, Detect: 100 * time.Millisecond, Overage: mixedOverage})
	}
	globalKey := "global-" + strconv.FormatInt(global.Limit, 10)
	globalOps := func() int64 { return inners[0].opsOn(globalKey) + inners[1].opsOn(globalKey) }
	var admitted, requests, reachedAt, warmOps, warmRequests, endOps, endRequests, warmAt, endAt atomic.Int64
	var warm, ended atomic.Bool
	start := time.Now()
	running := func() bool {
		if elapsed := time.Since(start); elapsed < time.Second || !untilBound && elapsed < 2*time.Second {
			return true
		}
		if !untilBound {
			// A loaded machine sends few requests in two seconds, and then the syncs, a
			// fixed number a second, outweigh them: run on to enough hot requests.
			return requests.Load()-warmRequests.Load() < mixedHotRequests && time.Since(start) < mixedBoundCap
		}
		if r := reachedAt.Load(); r != 0 {
			// Half a second past the bound, and enough requests past it to catch an overage
			// (a loaded machine sends few in half a second).
			past := requests.Load() - admitted.Load()
			return (time.Since(time.Unix(0, r)) < 500*time.Millisecond || past < mixedPastBound) && time.Since(start) < mixedBoundCap
		}
		// A loaded machine may need many times the unloaded time to send 20,000 requests: the
		// cap only stops a run that never reaches the bound, which the caller then reports.
		return untilBound && time.Since(start) < mixedBoundCap
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			node := nodes[g%2]
			res := make([]algorithm.Result, 2)
			for n := g; running(); n += 16 {
				ops := []store.Op{
					{Key: []byte(prefix + strconv.Itoa(n%users)), Params: &perUser, Cost: 1},
					{Key: []byte(globalKey), Params: &global, Cost: 1},
				}
				if _, err := node.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
					t.Error(err)
					return
				}
				requests.Add(1)
				if time.Since(start) > 300*time.Millisecond && warm.CompareAndSwap(false, true) {
					warmOps.Store(globalOps())
					warmRequests.Store(requests.Load())
					warmAt.Store(time.Now().UnixNano())
				}
				if allowedAll(ops, res) && admitted.Add(1) == global.Limit {
					reachedAt.CompareAndSwap(0, time.Now().UnixNano())
				}
				if reachedAt.Load() != 0 && ended.CompareAndSwap(false, true) {
					endOps.Store(globalOps())
					endRequests.Store(requests.Load())
					endAt.Store(time.Now().UnixNano())
				}
			}
		})
	}
	wg.Wait()
	if !ended.Load() {
		endOps.Store(globalOps())
		endRequests.Store(requests.Load())
		endAt.Store(time.Now().UnixNano())
	}
	run := mixedRun{requests: requests.Load(), admitted: admitted.Load(),
		hotOps: endOps.Load() - warmOps.Load(), hotRequests: endRequests.Load() - warmRequests.Load(),
		hotFor: time.Duration(endAt.Load() - warmAt.Load())}
	for _, n := range nodes {
		st := n.Stats()
		run.mixed, run.local = run.mixed+st.Mixed, run.local+st.Local
		n.Close() // writes back what is pending
	}
	look, err := redis.New(ctx, "redis://"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer look.Close()
	looks := make([]store.Op, 0, 500)
	res := make([]algorithm.Result, cap(looks))
	for u := 0; u < users; u += cap(looks) {
		looks = looks[:0]
		for v := u; v < u+cap(looks); v++ {
			looks = append(looks, store.Op{Key: []byte(prefix + strconv.Itoa(v)), Params: &perUser})
		}
		if _, err := look.Apply(ctx, &store.Batch{Ops: looks}, res); err != nil {
			t.Fatal(err)
		}
		for i := range looks {
			run.usersCounted += perUser.Limit - res[i].Remaining
		}
	}
	t.Logf("global limit %d: %d requests, %d mixed, %d local, %d admitted, users counted %d; the global key in %d store ops for the %d requests from 300 ms to the end or the bound",
		global.Limit, run.requests, run.mixed, run.local, run.admitted, run.usersCounted, run.hotOps, run.hotRequests)
	if run.local != 0 {
		t.Errorf("%d requests decided locally: a user's key became hot", run.local)
	}
	if run.usersCounted != run.admitted {
		t.Errorf("the users' limits counted %d, want the %d admitted requests", run.usersCounted, run.admitted)
	}
	return run
}

// TestMixedBatchSparesTheStore: a user's limit beside a hot global one that no node's share of
// runs out: once the global key is hot it reaches the store in its syncs and at most a tenth of
// the requests beyond them, and every request is admitted and counted once by its user's limit.
func TestMixedBatchSparesTheStore(t *testing.T) {
	t.Parallel()
	global, _ := algorithm.NewParams(algorithm.FixedWindow, 100_000_000, 0, longWindow)
	run := mixedHammer(t, redistest.Start(t), global, false)
	// Once hot, the global key reaches the store in its syncs (each node's every 50 ms), not per
	// request: at most a tenth of the requests beyond those. A loaded machine sends few
	// requests a second, so the syncs alone can be more than a tenth of them.
	syncs := 2*int64(run.hotFor/(50*time.Millisecond)) + 4
	if run.hotRequests < mixedHotRequests || run.hotOps > run.hotRequests/10+syncs {
		t.Errorf("the global key reached the store in %d ops for %d requests in %v once hot: want at most a tenth of them (of at least %d) beyond the %d syncs",
			run.hotOps, run.hotRequests, run.hotFor, mixedHotRequests, syncs)
	}
	if run.admitted != run.requests {
		t.Errorf("%d of %d requests admitted under a limit of %d", run.admitted, run.requests, global.Limit)
	}
}

// TestMixedBatchStaysInBounds: the same under a global limit of 20,000, which the nodes' shares
// reach: the admitted requests stay within the limit and each node's cap (mixedOverage), and a request the global limit denied took
// nothing from its user (mixedHammer checks the users' counts). Requests past a node's share go
// to the store whole (TestMixedHotDenialAsksTheStore), so how often the global key reaches the
// store here depends on the machine's speed, and is not checked.
func TestMixedBatchStaysInBounds(t *testing.T) {
	t.Parallel()
	global, _ := algorithm.NewParams(algorithm.FixedWindow, 20_000, 0, longWindow)
	run := mixedHammer(t, redistest.Start(t), global, true)
	if denied := run.requests - run.admitted; denied < mixedPastBound {
		t.Fatalf("only %d requests denied: too few past the bound of %d to test it", denied, global.Limit)
	}
	nodeCap := int64(mixedOverage * float64(global.Limit) / 2)
	if bound := global.Limit + 2*nodeCap; run.admitted > bound || run.admitted < global.Limit {
		t.Errorf("admitted %d, want from the limit %d to it and 2 nodes' caps of %d, %d", run.admitted, global.Limit, nodeCap, bound)
	}
}

// BenchmarkMixedBatch: a user's limit (on the store, here the memory store) beside a hot
// global limit, against the same batch with nothing hot (the store decides both).
func BenchmarkMixedBatch(b *testing.B) {
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1<<40, 0, longWindow)
	for _, hot := range []bool{false, true} {
		b.Run("hot="+strconv.FormatBool(hot), func(b *testing.B) {
			h := New(memory.New(), Options{SyncEvery: time.Hour, Detect: time.Hour})
			defer h.Close()
			if hot {
				h.Promote([]byte("global"), wide)
			}
			ops := []store.Op{{Key: []byte("user"), Params: &wide, Cost: 1}, {Key: []byte("global"), Params: &wide, Cost: 1}}
			bt := &store.Batch{Ops: ops}
			res := make([]algorithm.Result, len(ops))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.Apply(ctx, bt, res); err != nil {
					b.Fatal(err)
				}
			}
			if st := h.Stats(); hot && st.Mixed == 0 {
				b.Fatal("no mixed decision")
			}
		})
	}
}

// TestNonBindingOutOfShareAsksTheStore: a counter or a shadow limit out of this node's share
// while the store has room is decided by the store: a counter counts every request, and a
// shadow limit reports only what it would deny.
func TestNonBindingOutOfShareAsksTheStore(t *testing.T) {
	t.Parallel()
	forty, _ := algorithm.NewParams(algorithm.FixedWindow, 40, 0, longWindow) // a share of 2 (5%)
	for _, op := range []store.Op{{Key: []byte("count"), Counter: true}, {Key: []byte("shadow"), Shadow: true}} {
		h, _, shared := mixedFixture(t, "", map[string]algorithm.Params{string(op.Key): forty})
		op.Params, op.Cost = &forty, 1
		for i := range 4 {
			res := make([]algorithm.Result, 1)
			b := &store.Batch{Ops: []store.Op{op}}
			if _, err := h.Apply(ctx, b, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || b.HotKey != (i < 2) {
				t.Errorf("%s, request %d: allowed %v, local %v; want allowed, local within the share of 2", op.Key, i, res[0].Allowed, b.HotKey)
			}
		}
		syncCounts(t, h, shared, wantCount{string(op.Key), &forty, 4})
	}
}

// TestMixedBatchOnACluster: on a Redis Cluster a request under a user's limit and a global one
// spans two hash slots, so the store makes a script call per slot (and a refund when one slot
// denies). With the global key hot, only the user's slot is asked: half the script calls.
func TestMixedBatchOnACluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	// Plain windows off: they count these fixed windows with no script at all, and the
	// script calls are what this test counts.
	url := "redis-cluster://" + strings.Join(cl.Addrs, ",") + "?plain_windows=false"
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1_000_000, 0, longWindow)
	globalKey := key.AppendHead(nil, "global", "1")
	const requests = 200
	// run sends requests one at a time (no two coalesce) and returns the script calls they
	// made on all nodes.
	run := func(st store.Store, users string) int64 {
		t.Helper()
		for _, n := range cl.Nodes {
			if _, err := n.Do("CONFIG", "RESETSTAT"); err != nil {
				t.Fatal(err)
			}
		}
		res := make([]algorithm.Result, 2)
		for i := range requests {
			userKey := key.AppendTag(key.AppendHead(nil, "per-user", "1"), 'u', users+strconv.Itoa(i))
			b := &store.Batch{Ops: []store.Op{{Key: userKey, Params: &wide, Cost: 1}, {Key: globalKey, Params: &wide, Cost: 1}}}
			if _, err := st.Apply(ctx, b, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || !res[1].Allowed {
				t.Fatalf("request %d denied: %+v", i, res)
			}
		}
		var calls int64
		for _, n := range cl.Nodes {
			stats, err := n.Do("INFO", "commandstats")
			if err != nil {
				t.Fatal(err)
			}
			calls += scriptCalls(stats)
		}
		return calls
	}
	plain, err := redis.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	offCalls := run(plain, "off-")
	inner, err := redis.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	h := New(inner, Options{SyncEvery: time.Hour, Detect: time.Hour})
	h.Promote(globalKey, wide)
	onCalls := run(h, "on-")
	mixed := h.Stats().Mixed
	if err := h.Close(); err != nil { // writes the global key's hits back
		t.Fatal(err)
	}
	t.Logf("%d requests: %d script calls without hot-key mode, %d with the global key hot (%d mixed)", requests, offCalls, onCalls, mixed)
	if offCalls < requests*3/2 {
		t.Fatalf("%d script calls for %d requests without hot-key mode: the users' and the global key's slots should differ", offCalls, requests)
	}
	if onCalls > requests+requests/10 || mixed != requests {
		t.Errorf("%d script calls and %d mixed decisions for %d requests with the global key hot: want one call each", onCalls, mixed, requests)
	}
	if got := counted(t, plain, string(globalKey), &wide); got != 2*requests {
		t.Errorf("the global key counted %d, want the %d requests", got, 2*requests)
	}
}
