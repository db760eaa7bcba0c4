package breaker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testproxy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

var ctx = context.Background()

func guarded(t *testing.T, addr string, o Options) (*Store, *[]string) {
	t.Helper()
	inner, err := redis.New(ctx, "redis://"+addr, redis.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var changes []string
	o.OnStateChange = func(from, to string) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, to)
	}
	s := New(inner, o)
	t.Cleanup(func() { s.Close() })
	return s, &changes
}

func batch() *store.Batch {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000, 0, time.Second)
	return &store.Batch{Ops: []store.Op{{Key: key.AppendHead(nil, "guarded", "1"), Params: &p, Cost: 1}}}
}

// TestSlowStore delays every byte to and from a real Redis by far more than the deadline: no
// call waits much past the deadline, the breaker opens and then fails calls at once, and it
// closes again once Redis is fast.
func TestSlowStore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := testproxy.Start(t, srv.Addr)
	deadline := 20 * time.Millisecond
	s, changes := guarded(t, proxy.Addr, Options{Timeout: deadline, MinCalls: 10, OpenFor: 300 * time.Millisecond, Probes: 1})
	res := make([]algorithm.Result, 1)
	// Healthy first (a loaded test machine may miss one 20 ms deadline now and then).
	waitClosed(t, s, res)

	// Far slower than the deadline, so a call that waited on the store is unmistakable.
	proxy.Delay(5 * time.Second)
	var took []time.Duration
	for range 40 {
		start := time.Now()
		_, err := s.Apply(ctx, batch(), res)
		took = append(took, time.Since(start))
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("slow store: err %v, want ErrUnavailable", err)
		}
	}
	slices.Sort(took)
	// The bound is the deadline plus scheduling on a heavily loaded 2-core machine, not a speed
	// target; waiting on the store would take 5 s.
	if p99 := took[len(took)*99/100]; p99 > deadline+2*time.Second {
		t.Errorf("p99 of calls to a slow store %v, deadline %v", p99, deadline)
	}
	if s.State() != "open" {
		t.Fatalf("breaker %s after 40 timeouts, want open", s.State())
	}
	if took[0] > time.Millisecond {
		t.Errorf("with the breaker open the fastest call still took %v", took[0])
	}

	proxy.Delay(0)
	time.Sleep(400 * time.Millisecond) // past OpenFor: half-open, one probe
	waitClosed(t, s, res)
	if got := *changes; !slices.Contains(got, "open") || !slices.Contains(got, "half-open") || got[len(got)-1] != "closed" {
		t.Errorf("state changes %v, want open, half-open, closed", got)
	}
}

// TestDeadStore kills Redis: calls fail fast once the breaker opens, and a restarted Redis is
// picked up again without restarting anything.
func TestDeadStore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, _ := guarded(t, srv.Addr, Options{Timeout: 50 * time.Millisecond, MinCalls: 5, OpenFor: 200 * time.Millisecond})
	res := make([]algorithm.Result, 1)
	srv.Kill()
	for range 10 {
		if _, err := s.Apply(ctx, batch(), res); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("dead store: %v", err)
		}
	}
	if s.State() != "open" {
		t.Fatalf("breaker %s with Redis dead, want open", s.State())
	}
	srv.Restart(t)
	waitClosed(t, s, res)
}

func waitClosed(t *testing.T, s *Store, res []algorithm.Result) {
	t.Helper()
	// Generous: a half-open breaker probes a few times a second with the short deadline, and
	// on a loaded machine (or behind replies a slow store still owes) a run of probes can miss.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := s.Apply(ctx, batch(), res)
		if err == nil && s.State() == "closed" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s, last error %v, 30 s after the store recovered", s.State(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
