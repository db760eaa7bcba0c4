package breaker

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// fakeClock is the adaptive deadline's clock in tests.
type fakeClock struct{ t atomic.Int64 }

func (c *fakeClock) now() time.Duration  { return time.Duration(c.t.Load()) }
func (c *fakeClock) add(d time.Duration) { c.t.Add(int64(d)) }
func (c *fakeClock) calls(d *deadline, n int, took time.Duration) {
	for range n {
		d.record(took)
	}
}

func TestAdaptiveDeadline(t *testing.T) {
	t.Parallel()
	const floor, ceiling = 10 * time.Millisecond, 100 * time.Millisecond
	type phase struct {
		calls int
		took  time.Duration
		after time.Duration // clock advance after the calls
	}
	for _, tc := range []struct {
		name     string
		phases   []phase
		min, max time.Duration // the deadline after the phases
	}{
		{"no calls: the ceiling", nil, ceiling, ceiling},
		{"too few calls to judge: the ceiling", []phase{{15, time.Millisecond, 200 * time.Millisecond}}, ceiling, ceiling},
		{"fast store: the floor", []phase{{1000, 500 * time.Microsecond, 200 * time.Millisecond}}, floor, floor},
		{"loaded store: three times its p99.9", []phase{{990, time.Millisecond, 0}, {20, 15 * time.Millisecond, 200 * time.Millisecond}}, 45 * time.Millisecond, 52 * time.Millisecond},
		{"slow outliers under 0.1% are ignored", []phase{{2000, time.Millisecond, 0}, {1, 80 * time.Millisecond, 200 * time.Millisecond}}, floor, floor},
		{"slow outliers over 0.1% count", []phase{{1000, time.Millisecond, 0}, {5, 20 * time.Millisecond, 200 * time.Millisecond}}, 60 * time.Millisecond, 70 * time.Millisecond},
		{"very slow store: the ceiling", []phase{{1000, 60 * time.Millisecond, 200 * time.Millisecond}}, ceiling, ceiling},
		{"load passed, window gone: back to the floor", []phase{{1000, 30 * time.Millisecond, 0}, {1, 0, 11 * time.Second}, {1000, time.Millisecond, 200 * time.Millisecond}}, floor, floor},
		{"load passed, within the window: still raised", []phase{{1000, 30 * time.Millisecond, 0}, {1, 0, 3 * time.Second}, {1000, time.Millisecond, 200 * time.Millisecond}}, 90 * time.Millisecond, ceiling},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &fakeClock{}
			d := newDeadline(floor, ceiling, c.now)
			for _, p := range tc.phases {
				c.calls(d, p.calls, p.took)
				c.add(p.after)
			}
			d.record(time.Millisecond) // a call after the last phase: the recomputation is due
			if got := d.get(); got < tc.min || got > tc.max {
				t.Errorf("deadline %v, want %v to %v", got, tc.min, tc.max)
			}
		})
	}
}

// TestAdaptiveDeadlineClimbs: calls that keep failing at the deadline (all that is known is
// that they took that long) raise it a step per recomputation, up to the ceiling, and no
// sooner than a recomputation is due.
func TestAdaptiveDeadlineClimbs(t *testing.T) {
	t.Parallel()
	c := &fakeClock{}
	d := newDeadline(10*time.Millisecond, 100*time.Millisecond, c.now)
	// A fast store first: the deadline settles at the floor.
	c.calls(d, 1000, time.Millisecond)
	c.add(deadlineEvery)
	d.record(time.Millisecond)
	if d.get() != 10*time.Millisecond {
		t.Fatalf("after fast calls the deadline is %v, want the floor", d.get())
	}
	var seen []time.Duration
	for range 6 {
		c.calls(d, 200, d.get())
		if len(seen) > 0 && d.get() != seen[len(seen)-1] {
			t.Fatalf("the deadline moved to %v before a recomputation was due", d.get())
		}
		c.add(deadlineEvery)
		d.record(d.get())
		seen = append(seen, d.get())
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] || seen[i] > 100*time.Millisecond {
			t.Fatalf("deadlines %v: want a climb to 100ms", seen)
		}
	}
	if seen[0] <= 10*time.Millisecond || seen[len(seen)-1] != 100*time.Millisecond {
		t.Fatalf("deadlines %v: want a climb from above 10ms to 100ms", seen)
	}
}

func TestBucketBounds(t *testing.T) {
	t.Parallel()
	for _, took := range []time.Duration{0, time.Microsecond, 3 * time.Microsecond, 4 * time.Microsecond, 7 * time.Microsecond,
		99 * time.Microsecond, time.Millisecond, 15 * time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second} {
		i := bucket(took)
		if up := upper(i); took >= up || (i > 0 && took < upper(i-1)) {
			t.Errorf("%v in bucket %d of [%v, %v)", took, i, upper(i-1), up)
		}
		if up := upper(i); float64(up) > float64(max(took, 4*time.Microsecond))*1.26 {
			t.Errorf("%v: bucket %d ends at %v, over 25%% above", took, i, up)
		}
	}
}

// TestLoadedStoreKeepsBreakerClosed makes a real Redis busy (a script that spins for 40 ms
// every 50 ms, as a loaded server answers late) under 20 callers: a fixed 10 ms deadline
// fails most calls and opens the breaker, the adaptive one learns the latency and keeps it
// closed. Its ceiling here is 500 ms, not serve's 100 ms: on a loaded CI machine the calls'
// own scheduling adds to the 40 ms spins, and the test is of the learning, not of the ceiling.
func TestLoadedStoreKeepsBreakerClosed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		max      time.Duration
		wantOpen bool // fixed: the load must fail many calls, or the test shows nothing
	}{{"fixed", 0, true}, {"adaptive", 500 * time.Millisecond, false}} {
		// One after the other: two spinning servers and their loads at once would starve
		// each other on a small machine.
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			inner, err := redis.New(ctx, "redis://"+srv.Addr, redis.WithTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var changes []string
			counting := false // from the spinning on
			s := New(inner, Options{MaxTimeout: tc.max, OnStateChange: func(_, to string) {
				mu.Lock()
				defer mu.Unlock()
				if counting {
					changes = append(changes, to)
				}
			}})
			t.Cleanup(func() { s.Close() })
			var failed, calls atomic.Int64
			load := redistest.StartLoad(t, 20, time.Millisecond, func(int) func() {
				b, res := batch(), make([]algorithm.Result, 1)
				return func() {
					calls.Add(1)
					if _, err := s.Apply(ctx, b, res); err != nil {
						if !errors.Is(err, store.ErrUnavailable) {
							t.Errorf("err %v", err)
						}
						failed.Add(1)
					}
				}
			})
			// A healthy store first, under the load, until the breaker is closed (a loaded
			// machine can make the first calls slow and open it: that is not this test's).
			healthy := false
			for range 10 {
				if !closesWithin(s, 10*time.Second) {
					break
				}
				time.Sleep(300 * time.Millisecond) // long enough to measure the healthy store
				if s.State() == "closed" {
					healthy = true
					break
				}
			}
			if !healthy {
				if tc.max == 0 {
					// A machine so loaded that the healthy store misses the fixed deadline
					// under this load leaves the busy spell nothing to show.
					t.Skipf("the healthy store kept the fixed-deadline breaker open under the load (a loaded machine): nothing to compare")
				}
				t.Fatalf("breaker %s with the healthy store under the load", s.State())
			}
			mu.Lock()
			counting = true
			mu.Unlock()
			calls.Store(0)
			failed.Store(0)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				const spin = `local t = redis.call('TIME'); local until_us = t[1] * 1000000 + t[2] + 40000
					repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us`
				for {
					select {
					case <-stop:
						return
					default:
					}
					srv.Do("EVAL", spin, "0")
					time.Sleep(10 * time.Millisecond)
				}
			}()
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			load.Stop()
			mu.Lock()
			defer mu.Unlock()
			opened := false
			for _, c := range changes {
				opened = opened || c == "open"
			}
			share := float64(failed.Load()) / float64(max(1, calls.Load()))
			t.Logf("while Redis was busy: %d calls, %.1f%% failed; breaker changes %v; deadline %v", calls.Load(), 100*share, changes, s.Deadline())
			if tc.wantOpen && share < 0.4 {
				t.Errorf("%.1f%% of calls failed at the fixed deadline: the load is too light to show anything", 100*share)
			}
			// Under 25%: the first calls fail while it learns, and a loaded test machine adds
			// its own delays (typically 1-3%, at most 16% seen).
			if !tc.wantOpen && (opened || share > 0.25) {
				t.Errorf("%.1f%% of calls failed at the adaptive deadline, breaker changes %v: want under 25%% and no opening", 100*share, changes)
			}
		})
	}
}

// closesWithin reports whether s is closed, after a successful call, within d.
func closesWithin(s *Store, d time.Duration) bool {
	res := make([]algorithm.Result, 1)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := s.Apply(ctx, batch(), res); err == nil && s.State() == "closed" {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
