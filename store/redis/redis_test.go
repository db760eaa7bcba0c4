package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
)

var ctx = context.Background()

// clock is the test's time. It starts a day ahead of the real clock on a whole second, so the
// keys' real-time expiry (PEXPIREAT) never fires during a test: Redis keeps idle state that
// the memory store has dropped, and the two must still decide alike.
type clock struct{ us atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.us.Store(time.Now().Add(24 * time.Hour).Truncate(time.Second).UnixMicro())
	return c
}
func (c *clock) Now() int64 { return c.us.Load() }

func connect(t testing.TB, url string, c *clock, opts ...Option) *Store {
	t.Helper()
	s, err := New(ctx, url, append([]Option{WithTimeForTests(c.Now), WithTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// eachScriptMode runs f in a parallel subtest for each way the scripts run, on a Redis of its
// own: as a Function library (Redis 7+, the default) and as EVALSHA scripts (WithScripts).
func eachScriptMode(t *testing.T, f func(t *testing.T, st *Store, c *clock)) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"functions", nil}, {"scripts", []Option{WithScripts()}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			c := newClock()
			st := connect(t, "redis://"+srv.Addr, c, mode.opts...)
			if st.functions != (mode.name == "functions") {
				t.Fatalf("functions = %v", st.functions)
			}
			f(t, st, c)
		})
	}
}

// limit is one bucket of the differential test: a key and its parameters.
type limit struct {
	key    []byte
	params algorithm.Params
	// counter is the key of the limit's counter ops (store.Op.Counter), apart from key.
	counter []byte
}

func limits(t testing.TB) []limit {
	var ls []limit
	for i, k := range algorithm.Kinds {
		for j, spec := range []struct {
			n, b   int64
			period time.Duration
		}{{5, 0, time.Second}, {3, 8, 7 * time.Millisecond}, {20, 0, time.Minute}} {
			p, err := algorithm.NewParams(k, spec.n, spec.b, spec.period)
			if err != nil {
				t.Fatal(err)
			}
			// Half the keys carry a caller's hash tag, half are global: on a Cluster they
			// spread over slots, so batches cross slots.
			k := key.AppendHead(nil, fmt.Sprintf("rule%d-%d", i, j), "v1")
			if j%2 == 0 {
				k = key.AppendTag(k, 'u', fmt.Sprint("user", i%3))
			}
			counter := key.AppendHead(nil, fmt.Sprintf("rule%d-%d", i, j), "!burst")
			if j%2 == 0 {
				counter = key.AppendTag(counter, 'u', fmt.Sprint("user", i%3))
			}
			ls = append(ls, limit{key: k, params: p, counter: counter})
		}
	}
	// Calendar windows and limits that drain on deny too: refunds, idempotency and a
	// Cluster's slots treat them as any op.
	ls = append(ls, calendarLimits(t)...)
	return append(ls, drainLimits(t)...)
}

// differential sends the same random traffic through the memory store and st at the same
// instants and requires identical results. With idempotency, a third of the batches carry one
// of 8 keys: often an exact retry of the key's last batch, sometimes that batch changed (a
// cost, an op more, a shadow flag) or another batch altogether, which both stores must refuse
// alike while the key's record lives (and neither remembers a denial).
func differential(t *testing.T, st *Store, c *clock, steps int, seed uint64, idempotency bool) {
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(seed, 1))
	ls := limits(t)
	last := map[string][]store.Op{} // an idempotency key's last batch
	refused, replays := 0, 0
	for step := range steps {
		switch rng.IntN(10) {
		case 0: // jump to just before or at a window boundary
			period := ls[rng.IntN(len(ls))].params.Period
			next := (c.Now()/period + 1) * period
			c.us.Store(next - rng.Int64N(2))
		case 1:
			c.us.Add(rng.Int64N(3_000_000))
		default:
			c.us.Add(rng.Int64N(20_000))
		}
		randomOp := func() store.Op {
			l := &ls[rng.IntN(len(ls))]
			if rng.IntN(6) == 0 {
				// A counter (escalation's burst counter) has a key no other kind of op
				// uses, and counts even in batches that another op denies.
				return store.Op{Key: l.counter, Params: &l.params, Cost: rng.Int64N(3), Counter: true}
			}
			return store.Op{Key: l.key, Params: &l.params, Cost: rng.Int64N(6), Shadow: rng.IntN(8) == 0}
		}
		var b store.Batch
		for range 1 + rng.IntN(4) {
			b.Ops = append(b.Ops, randomOp())
		}
		if idempotency && rng.IntN(3) == 0 {
			// Half the keys carry a caller's hash tag, as the limiter's do: on a Cluster their
			// record's own slot is often one the batch uses, and otherwise an extra one.
			id := fmt.Sprintf("req-%d", rng.IntN(8))
			if rng.IntN(2) == 0 {
				id = fmt.Sprintf("sl:idem:{u=user%d}:%s", rng.IntN(3), id)
			}
			if prev, ok := last[id]; ok {
				switch r := rng.IntN(8); {
				case r < 4: // an exact retry
					b.Ops = slices.Clone(prev)
				case r == 4: // another cost
					b.Ops = slices.Clone(prev)
					b.Ops[rng.IntN(len(b.Ops))].Cost += 1 + rng.Int64N(3)
				case r == 5: // a limit more
					b.Ops = append(slices.Clone(prev), randomOp())
				case r == 6: // a shadow flag flipped
					b.Ops = slices.Clone(prev)
					i := rng.IntN(len(b.Ops))
					b.Ops[i].Shadow = !b.Ops[i].Shadow
				} // else another batch altogether
			}
			last[id] = b.Ops
			b.IdempotencyKey = []byte(id)
			b.IdempotencyTTL = time.Duration(2+rng.IntN(20)) * time.Second
			b.IdempotencyFingerprint, _ = store.FingerprintOf(b.Ops, nil)
		}
		want := make([]algorithm.Result, len(b.Ops))
		got := make([]algorithm.Result, len(b.Ops))
		wantReplay, wantErr := mem.Apply(ctx, &b, want)
		gotReplay, err := st.Apply(ctx, &b, got)
		if wantErr != nil || err != nil {
			if !errors.Is(wantErr, store.ErrIdempotencyMismatch) || !errors.Is(err, store.ErrIdempotencyMismatch) {
				t.Fatalf("step %d: redis error %v, memory error %v", step, err, wantErr)
			}
			refused++
			continue
		}
		if gotReplay != wantReplay {
			t.Fatalf("step %d: replayed %v, memory %v", step, gotReplay, wantReplay)
		}
		if gotReplay {
			replays++
		}
		for i := range want {
			if got[i] != want[i] {
				op := b.Ops[i]
				t.Fatalf("step %d op %d (%s %d/%dµs burst %d, cost %d, shadow %v, counter %v, key %s):\n redis  %+v\n memory %+v",
					step, i, op.Params.Kind, op.Params.Limit, op.Params.Period, op.Params.Burst, op.Cost, op.Shadow, op.Counter, op.Key, got[i], want[i])
			}
		}
	}
	if idempotency && (refused == 0 || replays == 0) {
		t.Fatalf("idempotency untested: %d reuses refused, %d replays", refused, replays)
	}
	t.Logf("%d steps: %d idempotent replays, %d reuses refused", steps, replays, refused)
}

func TestSameDecisionsAsMemory(t *testing.T) {
	t.Parallel()
	eachScriptMode(t, func(t *testing.T, st *Store, c *clock) {
		differential(t, st, c, 3000, 1, true)
	})
}

// checkCounter checks store.Op.Counter on st: a counter op counts every request of its
// batches, those another op denies included, never denies one, and is not given back by a
// refund; its siblings stay all or nothing. Its key is on another slot than the limit's, so a
// Cluster decides them in two groups.
func checkCounter(t *testing.T, st store.Store, name string) {
	t.Helper()
	one, _ := algorithm.NewParams(algorithm.FixedWindow, 1, 0, longWindow)
	three, _ := algorithm.NewParams(algorithm.FixedWindow, 3, 0, longWindow)
	limitKey := key.AppendHead(nil, "counted-"+name, "1")
	counterKey := key.AppendTag(key.AppendHead(nil, "counted-"+name, "!burst"), 'u', "ann")
	batch := &store.Batch{Ops: []store.Op{
		{Key: limitKey, Params: &one, Cost: 1},
		{Key: counterKey, Params: &three, Cost: 1, Counter: true},
	}}
	res := make([]algorithm.Result, 2)
	for i, want := range []struct {
		allowed, counted bool
		left             int64
	}{{true, true, 2}, {false, true, 1}, {false, true, 0}, {false, false, 0}, {false, false, 0}} {
		if _, err := st.Apply(ctx, batch, res); err != nil {
			t.Fatalf("%s: request %d: %v", name, i, err)
		}
		if res[0].Allowed != want.allowed || res[1].Allowed != want.counted || res[1].Remaining != want.left {
			t.Fatalf("%s: request %d: limit allowed %v, counter allowed %v remaining %d; want %v, %v, %d",
				name, i, res[0].Allowed, res[1].Allowed, res[1].Remaining, want.allowed, want.counted, want.left)
		}
	}
	// The limit itself was consumed once: the counter's counting took nothing from it.
	if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: limitKey, Params: &one}}}, res[:1]); err != nil || res[0].Remaining != 0 {
		t.Fatalf("%s: the limit has %d left (%v), want 0", name, res[0].Remaining, err)
	}
}

// TestCounterOps runs checkCounter on the memory store and on a Redis server, as functions and
// as scripts (the Cluster's run is in TestClusterAllOrNothing).
func TestCounterOps(t *testing.T) {
	t.Parallel()
	c := newClock()
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	checkCounter(t, mem, "memory")
	srv := redistest.Start(t)
	checkCounter(t, connect(t, "redis://"+srv.Addr, c), "functions")
	checkCounter(t, connect(t, "redis://"+srv.Addr, c, WithScripts()), "scripts")
}

// TestFunctionLibraryReloads flushes the library under a running store: the next call loads
// it again and succeeds.
func TestFunctionLibraryReloads(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.GCRA, 5, 0, time.Second)
	b := &store.Batch{Ops: []store.Op{{Key: []byte("sl:r:1:x"), Params: &p, Cost: 1}}}
	res := make([]algorithm.Result, 1)
	if _, err := st.Apply(ctx, b, res); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(ctx, b, res); err != nil || res[0].Remaining != 3 {
		t.Fatalf("after FUNCTION FLUSH: %v, remaining %d", err, res[0].Remaining)
	}
}

// TestClusterAllOrNothing checks that on a Cluster, where a request's limits sit on several
// slots, a denial on one slot leaves the others as they were: refunded in the same request.
func TestClusterAllOrNothing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := newClock()
	st := connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), c)
	if !st.cluster {
		t.Fatal("cluster not detected")
	}
	big, _ := algorithm.NewParams(algorithm.TokenBucket, 100, 0, time.Hour)
	small, _ := algorithm.NewParams(algorithm.FixedWindow, 2, 0, longWindow)
	log, _ := algorithm.NewParams(algorithm.SlidingWindowLog, 100, 0, time.Hour)
	userKey := key.AppendTag(key.AppendHead(nil, "per-user", "1"), 'u', "ann")
	globalKey := key.AppendHead(nil, "global", "1")
	logKey := key.AppendHead(nil, "global-log", "1")
	if Slot(userKey) == Slot(globalKey) || Slot(globalKey) == Slot(logKey) {
		t.Fatal("test keys share a slot; pick others")
	}
	res := make([]algorithm.Result, 3)
	batch := &store.Batch{Ops: []store.Op{
		{Key: globalKey, Params: &big, Cost: 1},
		{Key: logKey, Params: &log, Cost: 1},
		{Key: userKey, Params: &small, Cost: 1},
	}}
	for i := range 4 {
		if _, err := st.Apply(ctx, batch, res); err != nil {
			t.Fatal(err)
		}
		if res[2].Allowed != (i < 2) {
			t.Fatalf("request %d: small limit allowed=%v", i, res[2].Allowed)
		}
	}
	peek := &store.Batch{Ops: []store.Op{{Key: globalKey, Params: &big}, {Key: logKey, Params: &log}}}
	st.Apply(ctx, peek, res[:2])
	if res[0].Remaining != 98 || res[1].Remaining != 98 {
		t.Fatalf("after 2 allowed and 2 denied requests: remaining %d and %d, want 98 and 98 (denials refunded)", res[0].Remaining, res[1].Remaining)
	}
	checkCounter(t, st, "cluster")
	// And the cluster decides like the memory store, refunds and idempotency included: a
	// key's records are per slot, and its own slot catches a reuse wherever the limits live.
	differential(t, st, c, 1500, 2, true)
}

func TestScriptFlushAndTTLs(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c, WithScripts())
	ls := limits(t)
	apply := func() {
		for i := range ls {
			b := store.Batch{Ops: []store.Op{{Key: ls[i].key, Params: &ls[i].params, Cost: 1}}, IdempotencyKey: []byte("r"), IdempotencyTTL: time.Minute}
			if _, err := st.Apply(ctx, &b, make([]algorithm.Result, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply()
	if err := st.client.Do(ctx, st.client.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	apply() // EVALSHA misses after the flush and falls back to loading the script
	keys, err := st.client.Do(ctx, st.client.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	for _, k := range keys {
		ttl, err := st.client.Do(ctx, st.client.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil || ttl <= 0 {
			t.Errorf("key %q has no TTL (%d, %v)", k, ttl, err)
		}
	}
}

func TestAOFRestartKeepsQuota(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	c := newClock()
	url := "redis://" + srv.Addr
	st := connect(t, url, c)
	p, _ := algorithm.NewParams(algorithm.GCRA, 10, 0, time.Hour)
	k := key.AppendTag(key.AppendHead(nil, "r", "1"), 'u', "x")
	res := make([]algorithm.Result, 1)
	for range 7 {
		st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res)
	}
	time.Sleep(1100 * time.Millisecond) // appendfsync everysec
	srv.Kill()
	srv.Restart(t)
	st2 := connect(t, url, c)
	if _, err := st2.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p}}}, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 3 {
		t.Fatalf("after a crash and restart: remaining %d, want 3", res[0].Remaining)
	}
}

func TestStartupErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ url, want string }{
		{"redis://127.0.0.1:1", "127.0.0.1:1"},
		{"mysql://x", "unsupported scheme"},
		{"redis-sentinel://127.0.0.1:1", "master name"},
		{"redis://:secret@127.0.0.1:1", "xxxxx"},
		{"redis://user:secret@host:12a3/0", "not a valid URL"},
		{"redis://127.0.0.1:1?read_timeout=soon", "read_timeout"},
		{"redis://127.0.0.1:1?pool_size=-3", "pool_size"},
		{"redis://127.0.0.1:1?dial_timeout=x", "dial_timeout"},
		{"redis://127.0.0.1:1?max_flush_delay=-1ms", "max_flush_delay"},
	}
	for _, c := range cases {
		_, err := New(ctx, c.url, WithTimeout(time.Second))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q) = %v, want an error with %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// TestBoundKeepsTheSoonerDeadline: bound gives ctx the store's timeout unless the caller's own
// deadline is sooner, which it keeps (the same context). The deadline is checked against the
// instants around the call, not the time left after it, so a busy machine cannot fail it.
func TestBoundKeepsTheSoonerDeadline(t *testing.T) {
	t.Parallel()
	s := &Store{timeout: time.Second}
	for _, c := range []struct {
		name   string
		parent time.Duration // 0: no deadline
		kept   bool          // the caller's deadline is the sooner one
	}{
		{"no deadline", 0, false},
		{"sooner deadline kept", 10 * time.Millisecond, true},
		{"later deadline shortened", time.Hour, false},
	} {
		parent, cancelParent := context.Background(), context.CancelFunc(func() {})
		if c.parent > 0 {
			parent, cancelParent = context.WithTimeout(parent, c.parent)
		}
		before := time.Now()
		ctx, cancel := s.bound(parent)
		after := time.Now()
		deadline, ok := ctx.Deadline()
		switch {
		case !ok:
			t.Errorf("%s: no deadline", c.name)
		case c.kept:
			if want, _ := parent.Deadline(); !deadline.Equal(want) || ctx != parent {
				t.Errorf("%s: deadline %v in a new context (%v), want the caller's %v in its own", c.name, deadline, ctx != parent, want)
			}
		case deadline.Before(before.Add(s.timeout)) || deadline.After(after.Add(s.timeout)):
			t.Errorf("%s: deadline %v, want the store's timeout (%v) from the call, between %v and %v", c.name, deadline, s.timeout, before.Add(s.timeout), after.Add(s.timeout))
		}
		cancel()
		cancelParent()
	}
}

func TestMaxFlushDelay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url  string
		want time.Duration
	}{
		{"redis://127.0.0.1:6379", DefaultMaxFlushDelay},
		{"redis://127.0.0.1:6379?max_flush_delay=0", 0},
		{"redis://127.0.0.1:6379?max_flush_delay=20us", 20 * time.Microsecond},
		{"redis-cluster://127.0.0.1:7000,127.0.0.1:7001", DefaultMaxFlushDelay},
	} {
		opt, _, err := parseURL(c.url)
		if err != nil {
			t.Fatalf("parseURL(%q): %v", c.url, err)
		}
		if opt.MaxFlushDelay != c.want {
			t.Errorf("parseURL(%q): max flush delay %v, want %v", c.url, opt.MaxFlushDelay, c.want)
		}
	}
}

// TestSentinel finds the master through a real Sentinel and decides there.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "mymaster")
	c := newClock()
	st := connect(t, "redis-sentinel://"+sentinel.Addr+"/mymaster", c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 3, 0, time.Minute)
	k := key.AppendHead(nil, "via-sentinel", "1")
	res := make([]algorithm.Result, 1)
	for i := range 4 {
		if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i < 3) {
			t.Fatalf("request %d allowed=%v", i, res[0].Allowed)
		}
	}
	// The state is on the master Sentinel named: the window's count, its hash's one field.
	if v, err := master.Do("EVAL", "return redis.call('HVALS', KEYS[1])[1]", "1", redisKey(k)); err != nil || v != "3" {
		t.Fatalf("master holds %q (%v), want the count 3", v, err)
	}
}

// TestCancellationIsNotAStoreFailure: a caller that gives up gets an error that still says so,
// which the circuit breaker does not count against the store.
func TestCancellationIsNotAStoreFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st := connect(t, "redis://"+srv.Addr, newClock())
	p, _ := algorithm.NewParams(algorithm.GCRA, 5, 0, time.Second)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := st.Apply(cancelled, &store.Batch{Ops: []store.Op{{Key: []byte("sl:c:1:x"), Params: &p, Cost: 1}}}, make([]algorithm.Result, 1))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err %v: want both context.Canceled and store.ErrUnavailable", err)
	}
}

// TestLibraryLostOnOneNode flushes the function library on one Cluster node: the next request,
// whose limits span slots, reloads it and re-runs only that node's call, so the other slots
// consume once.
func TestLibraryLostOnOneNode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := newClock()
	st := connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 10, 0, longWindow)
	a, b := key.AppendHead(nil, "lost-a", "1"), key.AppendHead(nil, "lost-b", "1")
	if Slot(a) == Slot(b) {
		t.Fatal("test keys share a slot")
	}
	batch := &store.Batch{Ops: []store.Op{{Key: a, Params: &p, Cost: 1}, {Key: b, Params: &p, Cost: 1}}}
	res := make([]algorithm.Result, 2)
	if _, err := st.Apply(ctx, batch, res); err != nil {
		t.Fatal(err)
	}
	// Flush the library on the node that owns b (the others answer MOVED to a write of b).
	for _, n := range cl.Nodes {
		if _, err := n.Do("SET", redisKey(b)+":probe", "1"); err == nil {
			if _, err := n.Do("FUNCTION", "FLUSH"); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if _, err := st.Apply(ctx, batch, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 8 || res[1].Remaining != 8 {
		t.Fatalf("after the reload: remaining %d and %d, want 8 and 8 (each slot consumed once)", res[0].Remaining, res[1].Remaining)
	}
}

// TestRedisClock runs batches on Redis TIME, as production does: their head is the short one
// (a bare op count), which the differential tests, on a test clock, never send. Coalesced
// and not, a limit of 3 an hour allows 3 requests and denies the 4th with a retry; a leaky
// bucket reports the queue delay of its second request.
func TestRedisClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, coalesce := range []bool{true, false} {
		st, err := New(ctx, "redis://"+srv.Addr, WithCoalescing(coalesce))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		window, _ := algorithm.NewParams(algorithm.FixedWindow, 3, 0, time.Hour)
		leaky, _ := algorithm.NewParams(algorithm.LeakyBucket, 10, 0, time.Hour)
		k := key.AppendTag(key.AppendHead(nil, fmt.Sprint("clock-", coalesce), "1"), 'u', "ann")
		lk := key.AppendHead(nil, fmt.Sprint("clock-leaky-", coalesce), "1")
		b := &store.Batch{Ops: []store.Op{{Key: k, Params: &window, Cost: 1}, {Key: lk, Params: &leaky, Cost: 1}}}
		res := make([]algorithm.Result, 2)
		for i := range 4 {
			if _, err := st.Apply(ctx, b, res); err != nil {
				t.Fatalf("coalesce %v, request %d: %v", coalesce, i, err)
			}
			if res[0].Allowed != (i < 3) || res[0].Remaining != int64(max(0, 2-i)) || res[0].ResetAfter <= 0 {
				t.Fatalf("coalesce %v, request %d: %+v", coalesce, i, res[0])
			}
			if i == 3 && (res[0].RetryAfter <= 0 || res[0].RetryAfter > time.Hour.Microseconds()) {
				t.Fatalf("coalesce %v: denied with retry %d µs", coalesce, res[0].RetryAfter)
			}
			if i == 1 && (!res[1].Allowed || res[1].Delay <= 0) {
				t.Fatalf("coalesce %v: leaky bucket's second request %+v, want a delay", coalesce, res[1])
			}
		}
	}
}

// TestOpStringCache checks that the op-string table, which many ops share by set, always
// answers the op asked for: thousands of ops, each asked for twice in interleaved order, by
// four goroutines at once (the table is read and written without a lock).
func TestOpStringCache(t *testing.T) {
	st := &Store{}
	var ops []store.Op
	for limit := int64(1); limit <= 700; limit++ {
		for _, kind := range []algorithm.Kind{algorithm.FixedWindow, algorithm.TokenBucket} {
			p, err := algorithm.NewParams(kind, limit, 0, time.Duration(limit)*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops,
				store.Op{Params: &p, Cost: limit % 3},
				store.Op{Params: &p, Cost: 1, Shadow: true},
				store.Op{Params: &p, Cost: 1, Counter: true})
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() { checkOpStrings(t, st, ops, g) })
	}
	wg.Wait()
}

// checkOpStrings asks st for the string of every op twice, starting at a different place for
// each start, and checks each against its op.
func checkOpStrings(t *testing.T, st *Store, ops []store.Op, start int) {
	for round := range 2 {
		for i := range ops {
			op := &ops[(i*7919+round+start*1013)%len(ops)]
			got := strings.Split(st.opString(op), ",")
			mode := "0"
			if op.Counter {
				mode = "2"
			} else if op.Shadow {
				mode = "1"
			}
			p := op.Params
			want := []string{strconv.Itoa(int(p.Kind)), strconv.FormatInt(p.Limit, 10), strconv.FormatInt(p.Burst, 10), strconv.FormatInt(p.Period, 10)}
			if len(got) != 12 || !slices.Equal(got[:4], want) || got[10] != strconv.FormatInt(op.Cost, 10) || got[11] != mode {
				t.Errorf("op %+v (cost %d, shadow %v, counter %v): string %q", *p, op.Cost, op.Shadow, op.Counter, strings.Join(got, ","))
				return
			}
		}
	}
}

// longWindow is the window of the fixed-window limits these tests count on. The tests run on
// the wall clock (Redis TIME), and an hour's window rolled over in the middle of a CI run at the
// top of the hour, splitting a test's counts across two windows; the longest period allowed
// rolls over once in 400 days.
const longWindow = algorithm.MaxPeriod
