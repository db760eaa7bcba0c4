package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// TestCoalescedAllOrNothing sends 1,000 requests from 50 concurrent callers, each request
// under a shared limit of 300 and its caller's own limit of 10, at one instant of the test
// clock: coalesced calls must decide each batch all or nothing, so exactly 300 requests are
// allowed (on a Cluster, where the shared limit is on its own slot and a denial is refunded,
// no more than 300), and what each caller's limit consumed adds up to what the shared limit
// consumed. Calls must really have been shared.
func TestCoalescedAllOrNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cluster bool
	}{{"single server", false}, {"cluster", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.cluster && testing.Short() {
				t.Skip("starts a Redis Cluster")
			}
			var url string
			if tc.cluster {
				url = "redis-cluster://" + strings.Join(redistest.StartCluster(t, 3, 0).Addrs, ",")
			} else {
				url = "redis://" + redistest.Start(t).Addr
			}
			c := newClock()
			st := connect(t, url, c)
			const callers, each, sharedN, ownN = 50, 20, 300, 10
			shared, _ := algorithm.NewParams(algorithm.FixedWindow, sharedN, 0, longWindow)
			own, _ := algorithm.NewParams(algorithm.TokenBucket, ownN, 0, time.Hour)
			sharedKey := key.AppendHead(nil, "coalesce-shared", "1")
			ownKey := func(i int) []byte {
				return key.AppendTag(key.AppendHead(nil, "coalesce-own", "1"), 'u', fmt.Sprint("caller", i))
			}
			allowed := make([]int, callers)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b := &store.Batch{Ops: []store.Op{
						{Key: ownKey(i), Params: &own, Cost: 1},
						{Key: sharedKey, Params: &shared, Cost: 1},
					}}
					res := make([]algorithm.Result, 2)
					for range each {
						if _, err := st.Apply(ctx, b, res); err != nil {
							errs <- err
							return
						}
						if res[0].Allowed && res[1].Allowed {
							allowed[i]++
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			total := 0
			res := make([]algorithm.Result, 1)
			ownConsumed := 0
			for i := range callers {
				total += allowed[i]
				if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: ownKey(i), Params: &own}}}, res); err != nil {
					t.Fatal(err)
				}
				if used := ownN - int(res[0].Remaining); used != allowed[i] {
					t.Errorf("caller %d: own limit consumed %d, %d requests allowed", i, used, allowed[i])
				}
				ownConsumed += ownN - int(res[0].Remaining)
			}
			if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: sharedKey, Params: &shared}}}, res); err != nil {
				t.Fatal(err)
			}
			sharedConsumed := sharedN - int(res[0].Remaining)
			if sharedConsumed != total || ownConsumed != total {
				t.Errorf("%d requests allowed; the shared limit consumed %d, the callers' %d", total, sharedConsumed, ownConsumed)
			}
			if total > sharedN || !tc.cluster && total != sharedN {
				t.Errorf("%d requests allowed under a shared limit of %d", total, sharedN)
			}
			calls, batches := st.CoalesceStats()
			t.Logf("%d allowed; %d batches in %d calls", total, batches, calls)
			if calls == 0 || batches <= calls {
				t.Errorf("%d batches in %d calls: nothing was coalesced", batches, calls)
			}
		})
	}
}

// TestCoalescedErrorsStayTheirs puts a good batch, a batch whose key holds another type (Redis
// answers WRONGTYPE inside the script) and a batch whose caller left into one call: the first
// decides, the second fails alone, the third is never sent.
func TestCoalescedErrorsStayTheirs(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 5, 0, longWindow)
	good, bad, gone := key.AppendHead(nil, "good", "1"), key.AppendHead(nil, "bad", "1"), key.AppendHead(nil, "gone", "1")
	if _, err := srv.Do("RPUSH", redisKey(bad), "x"); err != nil {
		t.Fatal(err)
	}
	pendings := make([]*pending, 3)
	for i, k := range [][]byte{good, bad, gone} {
		g := st.group(&store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, new(scratch))[0]
		g.args[0] = fmt.Sprintf("1,1,%d,0,", c.Now()) // one op, one key, the test's clock
		pd := st.pendings.Get().(*pending)
		pd.keys, pd.args = g.keys, g.args
		pd.due.Store(st.since() + int64(10*time.Second))
		pendings[i] = pd
	}
	pendings[2].state.Store(pendingAbandoned)
	st.lane.flush(append([]*pending(nil), pendings...))
	if calls, batches := st.CoalesceStats(); calls != 1 || batches != 2 {
		t.Fatalf("%d batches in %d calls, want 2 in 1", batches, calls)
	}
	<-pendings[0].done
	<-pendings[1].done
	if err := pendings[0].err; err != nil || len(pendings[0].vals) != 8 || pendings[0].vals[2] != 1 || pendings[0].vals[4] != 4 {
		t.Errorf("good batch: %v %v, want allowed with 4 left", pendings[0].vals, err)
	}
	if err := pendings[1].err; err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("bad batch: err %v, want WRONGTYPE", err)
	}
	if n, err := srv.Do("EXISTS", redisKey(gone)); err != nil || n != "0" {
		t.Errorf("the abandoned batch's key exists (%s, %v): it was sent", n, err)
	}
}

// TestCoalescedDeadlines: a caller whose deadline passes while its lane is busy leaves on time
// with an error that says so, and its batch, still queued, consumes nothing.
func TestCoalescedDeadlines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 5, 0, longWindow)
	k := key.AppendHead(nil, "late", "1")
	// Hold the lane: a caller that will never be answered is in flight (its goroutine is
	// stopped before it sends, by holding the lane's queue as if a flush were running).
	st.lane.mu.Lock()
	st.lane.running = true
	st.lane.mu.Unlock()
	call, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := st.Apply(call, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, make([]algorithm.Result, 1))
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Apply took %v past a 20 ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err %v, want a store error that wraps the deadline", err)
	}
	// Let the lane run: it finds the batch abandoned and sends nothing.
	st.lane.mu.Lock()
	st.lane.running = false
	st.lane.mu.Unlock()
	res := make([]algorithm.Result, 1)
	if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p}}}, res); err != nil || res[0].Remaining != 5 {
		t.Fatalf("remaining %d (%v), want 5: the abandoned batch consumed", res[0].Remaining, err)
	}
}

// TestLaneWatch: the lane's one timer wakes a caller whose deadline passed while its batch is
// in a flight that has not come back, leaves a caller with a later deadline waiting, and is set
// again for a sooner deadline only. An expired batch is not answered by the lane afterwards.
func TestLaneWatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st := connect(t, "redis://"+srv.Addr, newClock())
	l := newLane(st, 0)
	waiting := func(in time.Duration) *pending {
		p := &pending{done: make(chan struct{}, 1)}
		p.due.Store(st.since() + int64(in))
		return p
	}
	watchAt := func() int64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.watchAt
	}
	late, soon, later := waiting(time.Hour), waiting(30*time.Millisecond), waiting(2*time.Hour)
	// The lane is busy with a flight holding soon and late, as if Redis had stopped answering.
	l.mu.Lock()
	l.running = true
	l.mu.Unlock()
	if err := l.submit(late); err != nil {
		t.Fatal(err)
	}
	armed := watchAt()
	if err := l.submit(soon); err != nil {
		t.Fatal(err)
	}
	// Soon's deadline may already have fired the watch on a slow machine: then soon expired.
	if got := watchAt(); got != soon.due.Load() && soon.state.Load() == pendingQueued || armed != late.due.Load() {
		t.Fatalf("watch at %d then %d, want late's %d then soon's %d", armed, got, late.due.Load(), soon.due.Load())
	}
	if err := l.submit(later); err != nil {
		t.Fatal(err)
	}
	if got := watchAt(); got != soon.due.Load() && got != late.due.Load() {
		t.Fatalf("a later deadline moved the watch to %d", got)
	}
	l.mu.Lock()
	l.flight, l.queue = l.queue[:2:2], l.queue[2:]
	l.mu.Unlock()

	select {
	case <-soon.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never woke the caller whose deadline passed")
	}
	if got := soon.state.Load(); got != pendingExpired {
		t.Fatalf("state %d, want expired", got)
	}
	select {
	case <-late.done:
		t.Fatal("the watch woke a caller an hour before its deadline")
	case <-later.done:
		t.Fatal("the watch woke a queued caller before its deadline")
	default:
	}
	if next := watchAt(); next != late.due.Load() {
		t.Fatalf("watch at %d after firing, want the next deadline %d", next, late.due.Load())
	}
	// The flight comes back: the expired caller is gone, the others are answered.
	for _, p := range []*pending{soon, late, later} {
		st.answer(p)
	}
	if got := soon.state.Load(); got != pendingExpired || len(soon.done) != 0 {
		t.Fatalf("expired batch: state %d, %d tokens; want it left as is", got, len(soon.done))
	}
	for _, p := range []*pending{late, later} {
		if p.state.Load() != pendingAnswered || len(p.done) != 1 {
			t.Fatalf("a waiting batch was not answered")
		}
	}
	l.watch.Stop()
}

// TestCoalescingOff: coalesce=false sends each request on its own, and decides the same.
func TestCoalescingOff(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr+"?coalesce=false", c)
	if st.coalesce {
		t.Fatal("coalesce=false left coalescing on")
	}
	differential(t, st, c, 1000, 3, true)
	if calls, _ := st.CoalesceStats(); calls != 0 {
		t.Fatalf("%d coalesced calls with coalescing off", calls)
	}
}

// TestCoalescedSameDecisionsAsMemory decides random batches several to a call, each at its
// own instant, and requires the memory store's results, applying them one after the other.
// The batches of a call share their keys' states (read once, written at the call's end), so
// this is where a state carried from one batch to the next must be exact. Now and then a
// batch ends with an op on a key of another type: it fails alone, after its other ops
// committed, and must leave nothing behind.
func TestCoalescedSameDecisionsAsMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	bad := key.AppendHead(nil, "wrong-type", "1")
	if _, err := srv.Do("RPUSH", redisKey(bad), "x"); err != nil {
		t.Fatal(err)
	}
	badParams, _ := algorithm.NewParams(algorithm.FixedWindow, 5, 0, longWindow)
	rng := rand.New(rand.NewPCG(7, 1))
	ls := limits(t)
	failed := 0
	for call := range 400 {
		type sent struct {
			b   store.Batch
			now int64
			p   *pending
			bad bool
		}
		var calls []sent
		for range 1 + rng.IntN(8) {
			c.us.Add(rng.Int64N(20_000))
			var b store.Batch
			for range 1 + rng.IntN(4) {
				l := &ls[rng.IntN(len(ls))]
				if rng.IntN(6) == 0 {
					b.Ops = append(b.Ops, store.Op{Key: l.counter, Params: &l.params, Cost: rng.Int64N(3), Counter: true})
				} else {
					b.Ops = append(b.Ops, store.Op{Key: l.key, Params: &l.params, Cost: rng.Int64N(4), Shadow: rng.IntN(8) == 0})
				}
			}
			isBad := rng.IntN(10) == 0
			if isBad {
				b.Ops = append(b.Ops, store.Op{Key: bad, Params: &badParams, Cost: 1})
			}
			g := st.group(&b, new(scratch))[0]
			g.args[0] = fmt.Sprintf("%d,%d,%d,0,", len(g.ops), len(g.keys), c.Now())
			pd := st.pendings.Get().(*pending)
			pd.keys, pd.args = g.keys, g.args
			pd.due.Store(st.since() + int64(10*time.Second))
			pd.state.Store(pendingQueued)
			calls = append(calls, sent{b: b, now: c.Now(), p: pd, bad: isBad})
		}
		pds := make([]*pending, len(calls))
		for i := range calls {
			pds[i] = calls[i].p
		}
		st.lane.flush(pds)
		end := c.Now()
		for i, s := range calls {
			<-s.p.done
			if s.bad {
				if s.p.err == nil || !strings.Contains(s.p.err.Error(), "WRONGTYPE") {
					t.Fatalf("call %d batch %d: err %v, want WRONGTYPE", call, i, s.p.err)
				}
				failed++
				continue
			}
			if s.p.err != nil {
				t.Fatalf("call %d batch %d: %v", call, i, s.p.err)
			}
			c.us.Store(s.now)
			want := make([]algorithm.Result, len(s.b.Ops))
			if _, err := mem.Apply(ctx, &s.b, want); err != nil {
				t.Fatal(err)
			}
			v := s.p.vals
			if len(v) != 2+6*len(s.b.Ops) || v[0] != decided {
				t.Fatalf("call %d batch %d: reply %v", call, i, v)
			}
			for j := range want {
				o := v[2+6*j:]
				got := algorithm.Result{Allowed: o[0] == 1, Reason: algorithm.Reason(o[1]), Remaining: o[2], ResetAfter: o[3], RetryAfter: o[4], Delay: o[5]}
				if got != want[j] {
					op := s.b.Ops[j]
					t.Fatalf("call %d batch %d op %d (%s, cost %d, shadow %v, counter %v, key %s):\n redis  %+v\n memory %+v",
						call, i, j, op.Params.Kind, op.Cost, op.Shadow, op.Counter, op.Key, got, want[j])
				}
			}
		}
		c.us.Store(end)
		for _, s := range calls {
			st.recyclePending(s.p)
		}
	}
	if failed == 0 {
		t.Fatal("no batch failed: the rollback is untested")
	}
}
