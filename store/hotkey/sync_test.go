package hotkey

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// TestIdleKeyKeepsPendingHits: a hot key nobody asked for during a detection interval goes back
// to the store only once its hits are written: one with hits pending stays until a sync.
func TestIdleKeyKeepsPendingHits(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	h, _, shared := mixedFixture(t, "", map[string]algorithm.Params{"global": wide})
	res := make([]algorithm.Result, 1)
	b := &store.Batch{Ops: []store.Op{{Key: []byte("global"), Params: &wide, Cost: 1}}}
	if _, err := h.Apply(ctx, b, res); err != nil || !b.HotKey {
		t.Fatalf("local %v, err %v", b.HotKey, err)
	}
	h.detect() // asked for far below the threshold, but a hit pending: stays
	h.detect() // not asked for, a hit pending: stays
	h.sync(ctx)
	if got := counted(t, shared, "global", &wide); got != 1 {
		t.Errorf("the store counted %d, want the 1 admitted", got)
	}
	h.detect() // idle, nothing pending: back to the store
	if st := h.Stats(); st.Hot != 0 {
		t.Errorf("%d keys hot after an idle interval with nothing pending, want 0", st.Hot)
	}
}

// TestCooledKeyRetires: a hot key asked for below half the threshold while hits are pending
// (a key with local decisions nearly always has some) retires: its next requests go to the
// store, the next sync writes the hits, and the next detection removes it. Asked for again
// above half meanwhile, it is decided locally again.
func TestCooledKeyRetires(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	for _, again := range []int{0, 100} {
		// 25/s over 2 s, sampled 1 in 8: 3 samples, 24 requests, keep a key hot.
		shared := memory.New()
		h := newStore(shared, Options{Threshold: 25, Detect: 2 * time.Second})
		defer h.Close()
		h.Promote([]byte("global"), wide)
		b := &store.Batch{Ops: []store.Op{{Key: []byte("global"), Params: &wide, Cost: 1}}}
		res := make([]algorithm.Result, 1)
		apply := func() bool {
			t.Helper()
			b.HotKey = false
			if _, err := h.Apply(ctx, b, res); err != nil || !res[0].Allowed {
				t.Fatalf("allowed %v, err %v", res[0].Allowed, err)
			}
			return b.HotKey
		}
		if !apply() {
			t.Fatal("a request on a ready hot key went to the store")
		}
		h.detect() // 1 request in the interval: retiring, with 1 hit pending
		if st := h.Stats(); st.Hot != 0 {
			t.Errorf("again %d: a retiring key counted among %d hot", again, st.Hot)
		}
		if apply() {
			t.Fatalf("again %d: a retiring key's request was decided locally", again)
		}
		for range again {
			apply()
		}
		h.sync(ctx)
		if got := counted(t, shared, "global", &wide); got != int64(2+again) {
			t.Errorf("again %d: the store counted %d, want %d", again, got, 2+again)
		}
		h.detect()
		if st := h.Stats(); (st.Hot == 1) != (again > 0) {
			t.Errorf("again %d: %d keys hot after the sync", again, st.Hot)
		}
		if again > 0 && !apply() {
			t.Error("a key asked for again above half the threshold is not decided locally")
		}
	}
}

// TestSyncWritesOnceWhenParamsChange: a request with other parameters for a hot key (a changed
// limit) while a sync writes the key's hits back: the hits are written once.
func TestSyncWritesOnceWhenParamsChange(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	changed, _ := algorithm.NewParams(algorithm.FixedWindow, 2000, 0, longWindow)
	h, ks, shared := mixedFixture(t, "global", map[string]algorithm.Params{"global": wide})
	for range 3 {
		b := &store.Batch{Ops: []store.Op{{Key: []byte("global"), Params: &wide, Cost: 1}}}
		if _, err := h.Apply(ctx, b, make([]algorithm.Result, 1)); err != nil || !b.HotKey {
			t.Fatalf("local %v, err %v", b.HotKey, err)
		}
	}
	ks.set(func(*store.Batch) {
		ks.set(nil, false) // once
		look := &store.Batch{Ops: []store.Op{{Key: []byte("global"), Params: &changed}}}
		if _, err := h.Apply(ctx, look, make([]algorithm.Result, 1)); err != nil {
			t.Error(err)
		}
	}, false)
	h.sync(ctx)
	h.sync(ctx)
	if got := counted(t, shared, "global", &wide); got != 3 {
		t.Errorf("the store counted %d, want the 3 admitted", got)
	}
}

// TestWriteBackKeepsWhatDidNotFit: a sync whose takes the store keeps refusing, other nodes
// taking from the key in between, while it still has room, keeps the hits pending for the next
// sync rather than dropping them; what then exceeds the store's capacity is the overage.
func TestWriteBackKeepsWhatDidNotFit(t *testing.T) {
	t.Parallel()
	now := int64(1_700_000_000_000_000)
	shared := memory.New(memory.WithClock(func() int64 { return now }), memory.WithSweepInterval(0))
	ks := &keyedStore{Store: shared, hook: "k"}
	h := New(ks, Options{SyncEvery: time.Hour, Detect: time.Hour, Overage: 1})
	defer h.Close()
	ten, _ := algorithm.NewParams(algorithm.FixedWindow, 10, 0, longWindow)
	h.Promote([]byte("k"), ten)
	for range 5 {
		b := &store.Batch{Ops: []store.Op{{Key: []byte("k"), Params: &ten, Cost: 1}}}
		if _, err := h.Apply(ctx, b, make([]algorithm.Result, 1)); err != nil || !b.HotKey {
			t.Fatalf("local %v, err %v", b.HotKey, err)
		}
	}
	others := 0 // another node takes 6, then 1 before each take
	ks.set(func(b *store.Batch) {
		if b.Ops[0].Cost == 0 {
			return // the look
		}
		cost := int64(1)
		if others == 0 {
			cost = 6
		}
		others++
		if _, err := shared.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: []byte("k"), Params: &ten, Cost: cost}}}, make([]algorithm.Result, 1)); err != nil {
			t.Error(err)
		}
	}, false)
	h.sync(ctx)
	ks.set(nil, false)
	if pending := h.hot["k"].pending; others != 4 || pending != 5 {
		t.Fatalf("after %d refused takes %d hits pending, want 4 and the 5 admitted", others, pending)
	}
	h.sync(ctx)
	if got, pending := counted(t, shared, "k", &ten), h.hot["k"].pending; got != 10 || pending != 0 {
		t.Errorf("the store counted %d with %d pending, want 10 (its capacity) and none", got, pending)
	}
}

// TestCloseWritesInflight: the last sync, at Close, writes a mixed batch's take still in
// flight (a shutdown that gave up draining): there is no later sync to write it.
func TestCloseWritesInflight(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	h, ks, shared := mixedFixture(t, "user", map[string]algorithm.Params{"global": wide})
	ks.set(func(*store.Batch) {
		h.closing.Store(true) // as Close does before its sync
		h.sync(ctx)
	}, false)
	ops := []store.Op{{Key: []byte("user"), Params: &wide, Cost: 1}, {Key: []byte("global"), Params: &wide, Cost: 1}}
	if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, make([]algorithm.Result, 2)); err != nil {
		t.Fatal(err)
	}
	if got := counted(t, shared, "global", &wide); got != 1 {
		t.Errorf("the store counted %d, want the take in flight at the last sync", got)
	}
}

// TestDetectAmongManyColdKeys: a node decides 8,000 or 32,000 requests in a detection interval
// of 2 s, each under its own user's limit (all cold) and 101 of them under a tenant's too: the
// tenant, at 50/s, is above the threshold of 25/s and becomes hot. The sketch is fed a sampled
// 1,000 or 4,000 keys, the tenant's ~12 among them. Space-Saving keeps only keys above n/k: 64
// counters lost the tenant among 8,000 requests' keys, and 256 among 32,000's; 1,024 keep keys
// above ~4.
func TestDetectAmongManyColdKeys(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1_000_000, 0, longWindow)
	for _, tc := range []struct{ requests, tenantEvery int }{
		{8_000, 79}, // 101 on the tenant; not multiples of the sampling period
		{32_000, 317},
	} {
		h := newStore(memory.New(), Options{Threshold: 25, Detect: 2 * time.Second})
		res := make([]algorithm.Result, 2)
		tenant := 0
		for i := range tc.requests {
			ops := []store.Op{{Key: []byte("user-" + strconv.Itoa(i)), Params: &wide, Cost: 1}}
			if i%tc.tenantEvery == tc.tenantEvery/2 {
				ops = append(ops, store.Op{Key: []byte("tenant"), Params: &wide, Cost: 1})
				tenant++
			}
			if _, err := h.Apply(ctx, &store.Batch{Ops: ops}, res[:len(ops)]); err != nil {
				t.Fatal(err)
			}
		}
		h.detect() // as the loop does every Detect
		h.mu.RLock()
		_, hot := h.hot["tenant"]
		n := len(h.hot)
		h.mu.RUnlock()
		h.Close()
		if !hot || n != 1 {
			t.Errorf("after %d requests on the tenant among %d, tenant hot %v, %d keys hot: want the tenant alone", tenant, tc.requests, hot, n)
		}
	}
}

// TestDetectHysteresis: a key becomes hot above the threshold and goes back to the store,
// once its hits are written, only below half of it; a cold key between the two stays cold.
// With a threshold of 25/s and a 2-s interval, a key needs 50 requests to become hot and 25 to
// stay hot (sampled one in 8).
func TestDetectHysteresis(t *testing.T) {
	t.Parallel()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1_000_000, 0, longWindow)
	h := newStore(memory.New(), Options{Threshold: 25, Detect: 2 * time.Second})
	defer h.Close()
	res := make([]algorithm.Result, 1)
	ask := func(key string, n int) {
		t.Helper()
		for range n {
			if _, err := h.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: []byte(key), Params: &wide, Cost: 1}}}, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	hot := func() []string {
		h.mu.RLock()
		defer h.mu.RUnlock()
		return slices.Sorted(maps.Keys(h.hot))
	}
	for _, step := range []struct {
		name          string
		burst, warm   int
		wantAfterSync []string
	}{
		{"burst above the threshold", 200, 40, []string{"burst"}},
		{"burst between half and the threshold", 40, 40, []string{"burst"}},
		{"burst below half", 16, 40, nil},
		{"warm above the threshold", 0, 120, []string{"warm"}},
	} {
		ask("burst", step.burst)
		ask("warm", step.warm)
		h.sync(ctx) // the local hits written: only the rate keeps a key hot
		h.detect()
		if got := hot(); !slices.Equal(got, step.wantAfterSync) {
			t.Errorf("%s: hot keys %v, want %v", step.name, got, step.wantAfterSync)
		}
	}
}

// TestSyncCoalescesWriteBacks: a sync writes 200 hot keys' hits back side by side, so the Redis
// store carries them in a few round trips rather than one per key; each key's hits are written
// once. Round trips are what Redis counts as reads from its clients (total_reads_processed): a
// pipeline written at once is read at once, whether it holds scripts or plain increments.
func TestSyncCoalescesWriteBacks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := redis.New(ctx, "redis://"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	h := New(st, Options{SyncEvery: time.Hour, Detect: time.Hour})
	defer h.Close()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, longWindow)
	const keys = 200
	ops := make([]store.Op, keys)
	for i := range ops {
		ops[i] = store.Op{Key: []byte("k" + strconv.Itoa(i)), Params: &wide, Cost: 1}
		h.Promote(ops[i].Key, wide)
	}
	for i := range ops { // after every Promote: each syncs
		b := &store.Batch{Ops: ops[i : i+1]}
		if _, err := h.Apply(ctx, b, make([]algorithm.Result, 1)); err != nil || !b.HotKey {
			t.Fatalf("key %d: local %v, err %v", i, b.HotKey, err)
		}
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	h.sync(ctx)
	stats, err := srv.Do("INFO", "stats")
	if err != nil {
		t.Fatal(err)
	}
	reads, err := strconv.ParseInt(redistest.InfoFields(stats)["total_reads_processed"], 10, 64)
	if err != nil {
		t.Fatalf("INFO stats total_reads_processed: %v", err)
	}
	t.Logf("a sync of %d keys with hits pending: %d reads by Redis (round trips, this INFO's included)", keys, reads)
	if reads > keys/4 {
		t.Errorf("a sync of %d keys took %d round trips: want the write-backs coalesced (at most %d)", keys, reads, keys/4)
	}
	looks := make([]store.Op, keys)
	for i := range looks {
		looks[i] = store.Op{Key: ops[i].Key, Params: &wide}
	}
	res := make([]algorithm.Result, keys)
	if _, err := st.Apply(ctx, &store.Batch{Ops: looks}, res); err != nil {
		t.Fatal(err)
	}
	for i := range res {
		if got := wide.Limit - res[i].Remaining; got != 1 {
			t.Fatalf("key %d: the store counted %d, want 1", i, got)
		}
	}
}
