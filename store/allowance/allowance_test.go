package allowance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

var ctx = context.Background()

// epoch is where the tests' clocks start: a window boundary of every period they use.
const epoch = int64(1_700_000_040_000_000)

type clock struct{ now atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.now.Store(epoch)
	return c
}

func (c *clock) Now() int64              { return c.now.Load() }
func (c *clock) advance(d time.Duration) { c.now.Add(d.Microseconds()) }

func params(t testing.TB, kind algorithm.Kind, limit int64, period time.Duration) *algorithm.Params {
	t.Helper()
	p, err := algorithm.NewParams(kind, limit, 0, period)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func sharedMemory(c *clock) *memory.Store {
	return memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
}

func node(t testing.TB, inner store.Store, c *clock) *Store {
	t.Helper()
	s, err := newStore(inner, Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func apply(t testing.TB, st store.Store, ops ...store.Op) []algorithm.Result {
	t.Helper()
	res := make([]algorithm.Result, len(ops))
	if _, err := st.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
		t.Fatal(err)
	}
	return res
}

func allowed(res []algorithm.Result) bool {
	for _, r := range res {
		if !r.Allowed {
			return false
		}
	}
	return true
}

// look reads a key's remaining from the store without consuming.
func look(t testing.TB, st store.Store, key string, p *algorithm.Params) int64 {
	t.Helper()
	return apply(t, st, store.Op{Key: []byte(key), Params: p})[0].Remaining
}

// TestDecidesAsTheStoreAlone runs random requests through a node with allowances and through a
// store alone, on one clock: every decision and every figure must be the same, whatever the
// node held, gave back or was asked to release (requests that go to the store whole, resets).
func TestDecidesAsTheStoreAlone(t *testing.T) {
	keys := []struct {
		name string
		p    *algorithm.Params
	}{
		{"user-a", params(t, algorithm.FixedWindow, 64, time.Second)},
		{"user-b", params(t, algorithm.FixedWindow, 200, time.Second)},
		{"tenant", params(t, algorithm.FixedWindow, 1000, time.Minute)},
		{"global", params(t, algorithm.FixedWindow, 5000, 100*time.Millisecond)},
	}
	bucket := params(t, algorithm.TokenBucket, 100, time.Second)
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 31))
			c := newClock()
			alone := sharedMemory(c)
			n := node(t, sharedMemory(c), c)
			for step := range 3000 {
				var ops []store.Op
				for _, k := range rng.Perm(len(keys))[:1+rng.IntN(3)] {
					ops = append(ops, store.Op{Key: []byte(keys[k].name), Params: keys[k].p, Cost: 1 + rng.Int64N(2)})
				}
				switch r := rng.IntN(100); {
				case r < 3:
					// Goes to the store whole: what the node holds on its keys goes back first.
					ops[0].Shadow = true
				case r < 5:
					ops = append(ops, store.Op{Key: []byte("bucket"), Params: bucket, Cost: 1})
				case r < 6:
					ops[0].Cost = ops[0].Params.Limit / 8 // past a grant
				case r < 7:
					k := []byte(keys[rng.IntN(len(keys))].name)
					if err := alone.Reset(ctx, [][]byte{k}); err != nil {
						t.Fatal(err)
					}
					if err := n.Reset(ctx, [][]byte{k}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want := apply(t, alone, ops...)
				got := apply(t, n, ops...)
				for i := range ops {
					if got[i] != want[i] {
						t.Fatalf("step %d op %d (%s, cost %d): got %+v, the store alone %+v", step, i, ops[i].Key, ops[i].Cost, got[i], want[i])
					}
				}
				switch r := rng.IntN(100); {
				case r < 2:
					c.advance(300 * time.Millisecond)
					n.sweep(ctx)
				case r < 60:
					c.advance(time.Duration(rng.IntN(3000)) * time.Microsecond)
				}
			}
			st := n.Stats()
			if st.Local == 0 || st.Grants == 0 || st.GivenBack == 0 {
				t.Fatalf("the node never used its allowances in full: %+v", st)
			}
		})
	}
}

// TestNodesNeverAdmitPastTheLimit has two nodes share a store and a key: in no window do they
// admit more than the limit between them, and with requests to spend what each holds they
// admit all of it.
func TestNodesNeverAdmitPastTheLimit(t *testing.T) {
	c := newClock()
	shared := sharedMemory(c)
	nodes := []*Store{node(t, shared, c), node(t, shared, c)}
	p := params(t, algorithm.FixedWindow, 500, time.Second)
	rng := rand.New(rand.NewPCG(7, 7))
	for window := range 5 {
		admitted := int64(0)
		for range 1200 {
			n := nodes[rng.IntN(2)]
			op := store.Op{Key: []byte("k"), Params: p, Cost: 1 + rng.Int64N(3)}
			if res := apply(t, n, op); res[0].Allowed {
				admitted += op.Cost
			}
			c.advance(500 * time.Microsecond)
		}
		if admitted > p.Limit {
			t.Fatalf("window %d: the nodes admitted %d of a limit of %d", window, admitted, p.Limit)
		}
		// What a node holds is spent by its next requests; requests of 3 may be refused
		// within 2 of the limit.
		if admitted < p.Limit-2 {
			t.Fatalf("window %d: the nodes admitted %d of %d though asked for more all along", window, admitted, p.Limit)
		}
		c.now.Store(epoch + int64(window+1)*time.Second.Microseconds())
	}
}

// TestIdleUnitsGoBack has a node take a grant and go quiet: until its sweep another node
// finds them counted, and after it the other node admits up to the limit exactly.
func TestIdleUnitsGoBack(t *testing.T) {
	c := newClock()
	shared := sharedMemory(c)
	a, b := node(t, shared, c), node(t, shared, c)
	p := params(t, algorithm.FixedWindow, 320, time.Second)
	op := store.Op{Key: []byte("k"), Params: p, Cost: 1}
	if res := apply(t, a, op); !res[0].Allowed || res[0].Remaining != 319 {
		t.Fatalf("first request: %+v, want allowed with 319 left", res[0])
	}
	grant := p.Limit / 32
	if got := look(t, shared, "k", p); got != 319-grant {
		t.Fatalf("the store has %d left, want %d: the grant counted at once", got, 319-grant)
	}
	c.advance(50 * time.Millisecond)
	a.sweep(ctx)
	if got := look(t, shared, "k", p); got != 319-grant {
		t.Fatalf("units went back before the node was idle: %d left", got)
	}
	c.advance(60 * time.Millisecond)
	a.sweep(ctx)
	if got := look(t, shared, "k", p); got != 319 {
		t.Fatalf("after the idle sweep the store has %d left, want 319", got)
	}
	admitted := int64(1)
	for range 400 {
		if res := apply(t, b, op); res[0].Allowed {
			admitted++
		}
	}
	if admitted != p.Limit {
		t.Fatalf("admitted %d, want the limit %d", admitted, p.Limit)
	}
	if res := apply(t, a, op); res[0].Allowed {
		t.Fatalf("the quiet node admitted past the limit: %+v", res[0])
	}
}

// gated passes batches to a store, holding the first until open is closed, and counts them.
type gated struct {
	*memory.Store
	calls  atomic.Int64
	open   chan struct{}
	before func() // runs before each batch reaches the store
}

func (g *gated) Apply(ctx context.Context, b *store.Batch, res []algorithm.Result) (bool, error) {
	if g.calls.Add(1) == 1 && g.open != nil {
		<-g.open
	}
	if g.before != nil {
		g.before()
	}
	return g.Store.Apply(ctx, b, res)
}

// gatedNode is a node over a gated memory store, on a test clock.
func gatedNode(t *testing.T) (*clock, *memory.Store, *gated, *Store) {
	c := newClock()
	shared := sharedMemory(c)
	inner := &gated{Store: shared}
	return c, shared, inner, node(t, inner, c)
}

// TestRequestsWaitForAGrantOnItsWay sends requests on a key while its first request's grant
// is on its way: they wait for it and are decided from it, without a round trip each.
func TestRequestsWaitForAGrantOnItsWay(t *testing.T) {
	inner := &gated{Store: memory.New(memory.WithSweepInterval(0)), open: make(chan struct{})}
	n, err := New(inner, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	p := params(t, algorithm.FixedWindow, 1000, time.Minute)
	op := store.Op{Key: []byte("k"), Params: p, Cost: 1}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	send := func() {
		defer wg.Done()
		if res := apply(t, n, op); res[0].Allowed {
			admitted.Add(1)
		}
	}
	wg.Add(1)
	go send()
	for inner.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	const followers = 20
	var started sync.WaitGroup
	for range followers {
		wg.Add(1)
		started.Add(1)
		go func() {
			started.Done()
			send()
		}()
	}
	started.Wait()
	time.Sleep(20 * time.Millisecond) // lets them reach the wait; a late one finds the units anyway
	close(inner.open)
	wg.Wait()
	if admitted.Load() != followers+1 {
		t.Fatalf("admitted %d of %d", admitted.Load(), followers+1)
	}
	if got := inner.calls.Load(); got != 1 {
		t.Fatalf("the store was asked %d times, want once: the followers did not wait for the grant", got)
	}
}

// TestRequestAcrossTheWindowsTurn has a request that took held units off its cost reach the
// store in the next window: it is counted there in full.
func TestRequestAcrossTheWindowsTurn(t *testing.T) {
	c, shared, inner, n := gatedNode(t)
	p := params(t, algorithm.FixedWindow, 640, time.Second) // grants of 20
	op := func(cost int64) store.Op { return store.Op{Key: []byte("k"), Params: p, Cost: cost} }
	apply(t, n, op(1))  // held 20
	apply(t, n, op(19)) // from them: 1 held
	c.advance(time.Second / 2)
	inner.before = func() { c.now.Store(epoch + time.Second.Microseconds()) }
	res := apply(t, n, op(5)) // takes the 1 held off, asks 4 and a grant: in the next window
	inner.before = nil
	if !res[0].Allowed {
		t.Fatalf("denied: %+v", res[0])
	}
	held := n.lookup([]byte("k")).held
	if got, want := look(t, shared, "k", p), p.Limit-5-held; got != want {
		t.Fatalf("the new window has %d left, want %d: the request counted short", got, want)
	}
	if res[0].Remaining != p.Limit-5 {
		t.Fatalf("reported %d left, want %d", res[0].Remaining, p.Limit-5)
	}
}

// TestGrantDeniedNearTheLimit has a node's first request on a key another node brought near its
// limit: the grant it asks does not fit, and the request alone is decided.
func TestGrantDeniedNearTheLimit(t *testing.T) {
	c := newClock()
	shared := sharedMemory(c)
	p := params(t, algorithm.FixedWindow, 320, time.Second)
	apply(t, shared, store.Op{Key: []byte("k"), Params: p, Cost: 318})
	n := node(t, shared, c)
	res := apply(t, n, store.Op{Key: []byte("k"), Params: p, Cost: 2})
	if !res[0].Allowed || res[0].Remaining != 0 {
		t.Fatalf("got %+v, want allowed with nothing left", res[0])
	}
	if res := apply(t, n, store.Op{Key: []byte("k"), Params: p, Cost: 1}); res[0].Allowed {
		t.Fatalf("admitted past the limit: %+v", res[0])
	}
}

// TestCloseGivesBack closes a node holding units: the store has them back.
func TestCloseGivesBack(t *testing.T) {
	c := newClock()
	shared := sharedMemory(c)
	n, err := New(shared, Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	p := params(t, algorithm.FixedWindow, 3200, time.Minute)
	apply(t, n, store.Op{Key: []byte("k"), Params: p, Cost: 1})
	if got := look(t, shared, "k", p); got != 3199-100 {
		t.Fatalf("before close %d left, want %d", got, 3199-100)
	}
	n.inner = memory.New() // Close closes its store: keep the shared one open to look at it
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if got := look(t, shared, "k", p); got != 3199 {
		t.Fatalf("after close %d left, want 3199", got)
	}
}

// TestSweptWhileInFlight has the sweep drop a key's entry while a request that took units of it
// off its cost waits for the store, which then denies it for another limit: the units it took
// go back to the store, since no one is left to spend them.
func TestSweptWhileInFlight(t *testing.T) {
	c, shared, inner, n := gatedNode(t)
	p := params(t, algorithm.FixedWindow, 320, time.Second) // grants of 10
	apply(t, n, store.Op{Key: []byte("k"), Params: p, Cost: 1})
	apply(t, shared, store.Op{Key: []byte("full"), Params: p, Cost: 320})
	inner.before = func() {
		c.advance(300 * time.Millisecond)
		n.sweep(ctx)
	}
	res := apply(t, n, store.Op{Key: []byte("k"), Params: p, Cost: 1}, store.Op{Key: []byte("full"), Params: p, Cost: 1})
	inner.before = nil
	if res[1].Allowed {
		t.Fatalf("admitted past a spent limit: %+v", res)
	}
	if n.lookup([]byte("k")) != nil {
		t.Fatal("the sweep kept the idle entry")
	}
	if got := look(t, shared, "k", p); got != 319 {
		t.Fatalf("the store has %d left on k, want 319: the unit the denied request took was lost", got)
	}
}
