package breaker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/stallwatch"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// The bounds the issue asks for, widened for a loaded CI machine under -race: none is a speed
// target. A call that waited on the paused store would take the whole pause (pauseFor). Calls
// are timed net of the moments the whole test process did not run (stallwatch).
const (
	callMargin = 250 * time.Millisecond // over the deadline, for any one call
	openWithin = 2 * time.Second        // from the pause to the breaker open (it lasts 3 s)
	backWithin = 30 * time.Second       // from SIGCONT to a decision from the store again
	pauseFor   = 3 * time.Second
	callers    = 20
)

// sample is one call of the load.
type sample struct {
	start, end time.Time
	err        error
}

// TestHungStore pauses Redis with SIGSTOP (the port stays open and nothing answers, as in a
// fork, a swap storm or a partition that drops packets) under 20 concurrent callers going
// through the guard as the server composes it (redis store, breaker with the default 10 ms
// deadline): no call waits much past the deadline, the breaker opens while Redis hangs, and
// decisions come from the store again soon after SIGCONT. On a Cluster, the node that owns
// the callers' keys is paused; the cluster's own failure detection is kept out of the way
// (cluster-node-timeout longer than the pause) so the test sees a hung node, not a failover.
//
// The same holds with the adaptive deadline (serve's default, --store-timeout-max 100ms), each
// call bounded by its ceiling: a hung store still trips the breaker.
func TestHungStore(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name  string
		max   time.Duration // Options.MaxTimeout
		bound time.Duration // the longest deadline a call gets
	}{{"fixed", 0, 10 * time.Millisecond}, {"adaptive", 100 * time.Millisecond, 100 * time.Millisecond}} {
		for _, tc := range redistest.HangTargets() {
			t.Run(mode.name+"/"+tc.Name, func(t *testing.T) {
				t.Parallel()
				hungStore(t, tc, mode.max, mode.bound)
			})
		}
	}
}

func hungStore(t *testing.T, tc redistest.HangTarget, maxTimeout, deadline time.Duration) {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000, 0, time.Second)
	head := key.AppendTag(key.AppendHead(nil, "hang", "1"), 'u', "caller")
	url, owner := tc.Start(t, string(key.HashTag(head)))

	inner, err := redis.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var opened []time.Time
	s := New(inner, Options{MaxTimeout: maxTimeout, OnStateChange: func(_, to string) {
		if to == "open" {
			mu.Lock()
			opened = append(opened, time.Now())
			mu.Unlock()
		}
	}})
	t.Cleanup(func() { s.Close() })
	waitClosed(t, s, make([]algorithm.Result, 1))
	stalls := stallwatch.Start(t)

	samples := make([][]sample, callers)
	var lastSuccess atomic.Int64 // unix nanoseconds of the end of the latest call that succeeded
	load := redistest.StartLoad(t, callers, time.Millisecond, func(i int) func() {
		// Each caller reuses its batch and results, as the limiter does: a store call
		// abandoned at its deadline must not touch them afterwards (-race).
		k := append(slices.Clip(head), ':', byte('a'+i))
		b := &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}
		res := make([]algorithm.Result, 1)
		return func() {
			start := time.Now()
			_, err := s.Apply(ctx, b, res)
			end := time.Now()
			samples[i] = append(samples[i], sample{start, end, err})
			if err == nil {
				lastSuccess.Store(end.UnixNano())
			}
		}
	})

	// A second of healthy calls first: a breaker that weighs failures against the
	// successes before them would take long to open.
	time.Sleep(time.Second)
	paused, resumed := owner.PauseFor(t, pauseFor)
	// Each half-open breaker lets a few probes through a second; on a loaded machine the
	// first may miss the deadline, so the load runs until one succeeds, or for backWithin.
	for time.Since(resumed) < backWithin+500*time.Millisecond {
		if time.Unix(0, lastSuccess.Load()).After(resumed) {
			time.Sleep(100 * time.Millisecond)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	load.Stop()

	var all []sample
	for _, ss := range samples {
		all = append(all, ss...)
	}
	slices.SortFunc(all, func(a, b sample) int { return a.start.Compare(b.start) })
	bound := deadline + callMargin
	var slowest sample
	slow := 0
	back := time.Duration(-1)
	for _, c := range all {
		// Time the whole process did not run is no call's doing.
		d := c.end.Sub(c.start) - stalls.During(c.start, c.end)
		if d > slowest.end.Sub(slowest.start) {
			slowest = sample{c.start, c.start.Add(d), c.err}
		}
		if d > bound {
			slow++
		}
		if c.err != nil && !errors.Is(c.err, store.ErrUnavailable) {
			t.Fatalf("call failed with %v, want store.ErrUnavailable", c.err)
		}
		// Redis is stopped some instant after Pause returns; allow it a moment.
		if c.err == nil && c.start.After(paused.Add(100*time.Millisecond)) && c.end.Before(resumed) {
			t.Fatalf("a call at %v after the pause succeeded: Redis was not paused", c.start.Sub(paused))
		}
		if c.err == nil && c.start.After(resumed) && back < 0 {
			back = c.end.Sub(resumed)
		}
	}
	t.Logf("%d calls, slowest %v (process stalls discounted), decisions back %v after SIGCONT", len(all), slowest.end.Sub(slowest.start), back)
	if slow > 0 {
		t.Errorf("%d calls took longer than %v; the slowest, %v after the pause, took %v (process stalls discounted)",
			slow, bound, slowest.start.Sub(paused).Round(time.Millisecond), slowest.end.Sub(slowest.start))
	}

	// Copied, not held: waitClosed below can open the breaker again, whose callback locks mu.
	mu.Lock()
	opened = slices.Clone(opened)
	mu.Unlock()
	i := slices.IndexFunc(opened, func(at time.Time) bool { return !at.Before(paused) })
	switch {
	case i < 0:
		t.Errorf("the breaker never opened while Redis was paused")
	case opened[i].Sub(paused) > openWithin:
		t.Errorf("the breaker opened %v after the pause, want within %v", opened[i].Sub(paused), openWithin)
	}
	if back >= 0 && back <= backWithin {
		return
	}
	if deadline > 10*time.Millisecond || back >= 0 {
		t.Errorf("first decision from the store %v after SIGCONT, want within %v", back, backWithin)
		return
	}
	// With the fixed 10-ms deadline, a CI machine saturated by other packages' tests can make
	// every round trip of the 20 callers miss it for as long as that lasts, hang or no hang
	// (two CI runs: none back within 30 s; back within a second when run alone). What must
	// hold is that the store decides again: one caller, without the load, within waitClosed's
	// 30 s.
	t.Logf("no decision under the load within %v of SIGCONT; checking that the store decides again", backWithin)
	waitClosed(t, s, make([]algorithm.Result, 1))
}

// TestCallerGoneIsNoProbe: while Redis hangs and the breaker is half-open, calls whose caller
// already gave up never reached the store and must not close the breaker.
func TestCallerGoneIsNoProbe(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, changes := guarded(t, srv.Addr, Options{Timeout: 20 * time.Millisecond, MinCalls: 5, OpenFor: 100 * time.Millisecond, Probes: 2})
	res := make([]algorithm.Result, 1)
	waitClosed(t, s, res)
	t.Cleanup(srv.Resume)
	srv.Pause()
	for s.State() == "closed" {
		s.Apply(ctx, batch(), res)
	}
	time.Sleep(150 * time.Millisecond) // past OpenFor: half-open
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for range 5 {
		if _, err := s.Apply(gone, batch(), res); err == nil {
			t.Fatal("a canceled call succeeded")
		}
	}
	if s.State() == "closed" {
		t.Fatalf("breaker closed by canceled calls while Redis is paused (changes %v)", *changes)
	}
}
