package redis

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// idemTarget is a store the idempotency tests run on, with its clock.
type idemTarget struct {
	name  string
	st    store.Store
	clock *clock
	redis *Store // nil for memory, which counts its records in its own tests
}

// idemTargets are the memory store, one Redis (Functions and scripts) and, unless -short, a
// Redis Cluster, where a request's limits and records spread over slots.
func idemTargets(t *testing.T) []idemTarget {
	t.Helper()
	// Every store's clock starts on a day boundary, so no case's hourly window turns over.
	const day = 24 * 60 * 60 * 1_000_000
	newClock := func() *clock {
		c := newClock()
		c.us.Store((c.Now()/day + 1) * day)
		return c
	}
	c := newClock()
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	t.Cleanup(func() { mem.Close() })
	targets := []idemTarget{{name: "memory", st: mem, clock: c}}
	srv := redistest.Start(t)
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"redis", nil}, {"redis-scripts", []Option{WithScripts()}}} {
		c := newClock()
		st := connect(t, "redis://"+srv.Addr, c, mode.opts...)
		targets = append(targets, idemTarget{name: mode.name, st: st, clock: c, redis: st})
	}
	if !testing.Short() {
		cl := redistest.StartCluster(t, 3, 0)
		c := newClock()
		st := connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), c)
		targets = append(targets, idemTarget{name: "cluster", st: st, clock: c, redis: st})
	}
	return targets
}

// records counts the idempotency records the store holds, on every node.
func (s *Store) records(t testing.TB) int {
	t.Helper()
	nodes := map[string]rueidis.Client{"": s.client}
	if s.cluster {
		nodes = s.client.Nodes()
	}
	n := 0
	for _, c := range nodes {
		cursor := uint64(0)
		for {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match("*idem3:*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatal(err)
			}
			n += len(e.Elements)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return n
}

// TestIdempotencyBinding runs the same requests on every store: a key replays only the batch it
// was first used for, a reuse for another batch is refused and consumes nothing on any slot,
// and a denial leaves no record, so its retry is decided afresh.
func TestIdempotencyBinding(t *testing.T) {
	t.Parallel()
	hour, _ := algorithm.NewParams(algorithm.FixedWindow, 10, 0, longWindow)
	small, _ := algorithm.NewParams(algorithm.FixedWindow, 1, 0, time.Second)
	tier, _ := algorithm.NewParams(algorithm.FixedWindow, 20, 0, longWindow)
	// Each case has keys of its own: a caller's (on its slot) and global ones (on others).
	type keys struct{ user, global, endpoint []byte }
	keysOf := func(name string) keys {
		return keys{
			user:     key.AppendTag(key.AppendHead(nil, "per-user-"+name, "1"), 'u', "ann"),
			global:   key.AppendHead(nil, "global-"+name, "1"),
			endpoint: key.AppendValue(key.AppendHead(nil, "per-endpoint-"+name, "1"), "/search"),
		}
	}
	type step struct {
		ops          func(k keys) []store.Op
		wantErr      error
		wantReplayed bool
		wantAllowed  bool
		after        time.Duration // the clock moves this much after the step
	}
	first := func(k keys) []store.Op {
		return []store.Op{{Key: k.user, Params: &hour, Cost: 2}, {Key: k.global, Params: &hour, Cost: 1}}
	}
	spend := func(k keys) []store.Op { return []store.Op{{Key: k.user, Params: &small, Cost: 1}} }
	// spent spends the caller's small limit with a request of its own, without a key.
	spent := func(t *testing.T, st store.Store, k keys) { apply1(t, st, &store.Batch{Ops: spend(k)}) }
	cases := []struct {
		name string
		// tagged: the key carries the caller's hash tag, as the limiter's do when the request
		// has an identity; on a Cluster its record's own slot is then the caller's.
		tagged bool
		setup  func(t *testing.T, st store.Store, k keys)
		steps  []step
		// remaining is what each key has left at the end: the requests consumed once.
		remaining map[string]int64
	}{
		{"exact retry replays", true, nil, []step{
			{ops: first, wantAllowed: true},
			{ops: first, wantReplayed: true, wantAllowed: true},
			{ops: first, wantReplayed: true, wantAllowed: true},
		}, map[string]int64{"user": 8, "global": 9}},
		{"another cost is refused", true, nil, []step{
			{ops: first, wantAllowed: true},
			{ops: func(k keys) []store.Op {
				return []store.Op{{Key: k.user, Params: &hour, Cost: 5}, {Key: k.global, Params: &hour, Cost: 1}}
			}, wantErr: store.ErrIdempotencyMismatch},
			{ops: first, wantReplayed: true, wantAllowed: true},
		}, map[string]int64{"user": 8, "global": 9}},
		{"another tier is refused", true, nil, []step{
			{ops: first, wantAllowed: true},
			{ops: func(k keys) []store.Op {
				return []store.Op{{Key: k.user, Params: &tier, Cost: 2}, {Key: k.global, Params: &hour, Cost: 1}}
			}, wantErr: store.ErrIdempotencyMismatch},
		}, map[string]int64{"user": 8, "global": 9}},
		{"a rule more is refused and untouched", true, nil, []step{
			{ops: first, wantAllowed: true},
			{ops: func(k keys) []store.Op {
				return append(first(k), store.Op{Key: k.endpoint, Params: &hour, Cost: 1})
			}, wantErr: store.ErrIdempotencyMismatch},
		}, map[string]int64{"user": 8, "global": 9, "endpoint": 10}},
		// On a Cluster the reuse touches only slots the first request did not: the key's own
		// slot catches it, and the slots that decided give back.
		{"limits elsewhere are refused and untouched", true, nil, []step{
			{ops: func(k keys) []store.Op { return []store.Op{{Key: k.user, Params: &hour, Cost: 1}} }, wantAllowed: true},
			{ops: func(k keys) []store.Op {
				return []store.Op{{Key: k.global, Params: &hour, Cost: 1}, {Key: k.endpoint, Params: &hour, Cost: 1}}
			}, wantErr: store.ErrIdempotencyMismatch},
		}, map[string]int64{"user": 9, "global": 10, "endpoint": 10}},
		{"limits elsewhere, key without a caller", false, nil, []step{
			{ops: func(k keys) []store.Op { return []store.Op{{Key: k.user, Params: &hour, Cost: 1}} }, wantAllowed: true},
			{ops: func(k keys) []store.Op { return []store.Op{{Key: k.global, Params: &hour, Cost: 1}} }, wantErr: store.ErrIdempotencyMismatch},
		}, map[string]int64{"user": 9, "global": 10}},
		{"a denial is decided afresh after Retry-After", true, spent, []step{
			{ops: spend, wantAllowed: false, after: time.Second},
			{ops: spend, wantAllowed: true},
			{ops: spend, wantReplayed: true, wantAllowed: true},
		}, nil},
		// Across slots: the global limit allows and consumes on its slot, the caller's denies
		// on another; the global part is given back and must not stay remembered, or the
		// retry would replay it and never charge the global limit.
		{"a denial across slots is decided afresh", true, spent, []step{
			{ops: func(k keys) []store.Op {
				return []store.Op{{Key: k.global, Params: &hour, Cost: 1}, {Key: k.user, Params: &small, Cost: 1}}
			}, wantAllowed: false, after: time.Second},
			{ops: func(k keys) []store.Op {
				return []store.Op{{Key: k.global, Params: &hour, Cost: 1}, {Key: k.user, Params: &small, Cost: 1}}
			}, wantAllowed: true},
		}, map[string]int64{"global": 9}},
		{"after the TTL another request is decided", true, nil, []step{
			{ops: first, wantAllowed: true, after: 6 * time.Minute},
			{ops: func(k keys) []store.Op { return []store.Op{{Key: k.user, Params: &hour, Cost: 1}} }, wantAllowed: true},
		}, map[string]int64{"user": 7, "global": 9}},
	}
	for _, target := range idemTargets(t) {
		t.Run(target.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					k := keysOf(strings.ReplaceAll(tc.name, " ", "-") + "-" + target.name)
					id := []byte("sl:idem:acme:" + target.name + tc.name)
					if tc.tagged {
						id = key.AppendValue(key.AppendTag([]byte("sl:idem"), 'u', "ann"), target.name+tc.name)
					}
					if tc.setup != nil {
						tc.setup(t, target.st, k)
					}
					for i, s := range tc.steps {
						b := &store.Batch{Ops: s.ops(k), IdempotencyKey: id, IdempotencyTTL: 5 * time.Minute}
						b.IdempotencyFingerprint, _ = store.FingerprintOf(b.Ops, nil)
						res := make([]algorithm.Result, len(b.Ops))
						replayed, err := target.st.Apply(ctx, b, res)
						if !errors.Is(err, s.wantErr) || (s.wantErr == nil && err != nil) {
							t.Fatalf("step %d: err %v, want %v", i, err, s.wantErr)
						}
						if err == nil {
							allowed := true
							for j := range res {
								allowed = allowed && (res[j].Allowed || b.Ops[j].Shadow)
							}
							if replayed != s.wantReplayed || allowed != s.wantAllowed {
								t.Fatalf("step %d: replayed=%v allowed=%v, want %v and %v (%+v)", i, replayed, allowed, s.wantReplayed, s.wantAllowed, res)
							}
						}
						if errors.Is(err, store.ErrIdempotencyMismatch) && replayed {
							t.Fatalf("step %d: a refused request reports a replay", i)
						}
						target.clock.us.Add(s.after.Microseconds())
					}
					for name, want := range tc.remaining {
						kk := map[string][]byte{"user": k.user, "global": k.global, "endpoint": k.endpoint}[name]
						r := apply1(t, target.st, &store.Batch{Ops: []store.Op{{Key: kk, Params: &hour}}})
						if r.Remaining != want {
							t.Errorf("%s limit: remaining %d, want %d", name, r.Remaining, want)
						}
					}
				})
			}
		})
	}
}

func apply1(t *testing.T, st store.Store, b *store.Batch) algorithm.Result {
	t.Helper()
	res := make([]algorithm.Result, len(b.Ops))
	if _, err := st.Apply(ctx, b, res); err != nil {
		t.Fatal(err)
	}
	return res[0]
}

// TestDeniedRequestsLeaveNoRecord sends 30,000 denied requests with distinct idempotency keys:
// Redis must hold no record of them (it held one per request for the TTL). On a Cluster the
// requests also span slots, where the slot that allowed wrote a record before the other denied.
func TestDeniedRequestsLeaveNoRecord(t *testing.T) {
	t.Parallel()
	small, _ := algorithm.NewParams(algorithm.FixedWindow, 1, 0, longWindow)
	big, _ := algorithm.NewParams(algorithm.FixedWindow, 1_000_000, 0, longWindow)
	for _, target := range idemTargets(t) {
		if target.redis == nil {
			continue // the memory store counts its records in its own tests
		}
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			const n = 30_000
			user := key.AppendTag(key.AppendHead(nil, "denied-"+target.name, "1"), 'u', "ann")
			global := key.AppendHead(nil, "denied-global-"+target.name, "1")
			apply1(t, target.st, &store.Batch{Ops: []store.Op{{Key: user, Params: &small, Cost: 1}}})
			const workers = 8
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := make([]algorithm.Result, 2)
					for i := w; i < n; i += workers {
						b := &store.Batch{
							Ops:            []store.Op{{Key: global, Params: &big, Cost: 1}, {Key: user, Params: &small, Cost: 1}},
							IdempotencyKey: fmt.Appendf(nil, "sl:idem:{u=ann}:acme:denied-%d", i), IdempotencyTTL: 5 * time.Minute,
						}
						b.IdempotencyFingerprint, _ = store.FingerprintOf(b.Ops, nil)
						if _, err := target.st.Apply(ctx, b, res); err != nil || res[1].Allowed {
							errs <- fmt.Errorf("request %d: err %v, allowed %v", i, err, res[1].Allowed)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := target.redis.records(t); got != 0 {
				t.Fatalf("%d denied requests with distinct keys left %d idempotency records, want 0", n, got)
			}
			if r := apply1(t, target.st, &store.Batch{Ops: []store.Op{{Key: global, Params: &big}}}); r.Remaining != big.Limit {
				t.Errorf("global limit: remaining %d after only denials, want %d", r.Remaining, big.Limit)
			}
		})
	}
}
