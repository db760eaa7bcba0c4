package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/stallwatch"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestRedisPausedUnderLoad is the issue's own trial: 20 callers on /v1/check of a node with
// the default store deadline (adaptive, 10 to 100 ms), and Redis paused with SIGSTOP (its port open, nothing
// answering) for 5 s. No check may wait on the paused Redis: each answers within the deadline
// plus a margin (wider than the store tests': a full HTTP round trip into another -race
// process on a loaded machine, whose stalls this process cannot see; waiting on Redis would
// take the whole pause), degraded and allowed as on_store_error: open says, and normal
// decisions come back soon after SIGCONT. The breaker's own timing is tested in store/breaker.
func TestRedisPausedUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		deadline = 100 * time.Millisecond // the --store-timeout-max default: the longest deadline
		margin   = 500 * time.Millisecond
		pauseFor = 5 * time.Second
	)
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, resiliencePolicy)
	node := start(t, path, filepath.Join(dir, "a"), "SLUICE_STORE=redis://"+redis.Addr)
	client := &http.Client{Timeout: 10 * time.Second}
	waitNormal := func(within time.Duration) time.Duration {
		start := time.Now()
		for time.Since(start) < within {
			if o, err := call(client, node, "/open", "probe"); err == nil && o.status == 200 && !o.degraded {
				return time.Since(start)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return -1
	}
	if waitNormal(10*time.Second) < 0 {
		t.Fatal("no normal decision from a fresh node")
	}

	var paused atomic.Bool
	var calls, failed, slow atomic.Int64
	var mu sync.Mutex
	var slowest time.Duration
	duringPause := map[outcome]int{}
	stalls := stallwatch.Start(t)
	// Paced, as clients are: fail-open answers come back at once, and 20 callers spinning on
	// them would starve the -race server of the CPU its probes need.
	load := redistest.StartLoad(t, 20, 2*time.Millisecond, func(g int) func() {
		return func() {
			p := paused.Load()
			start := time.Now()
			o, err := call(client, node, "/open", fmt.Sprint("u", g))
			// Time this test process did not run is no check's doing.
			d := time.Since(start) - stalls.During(start, time.Now())
			calls.Add(1)
			if err != nil || o.status != 200 {
				failed.Add(1)
			}
			if d > deadline+margin {
				slow.Add(1)
			}
			mu.Lock()
			slowest = max(slowest, d)
			if p && paused.Load() {
				duringPause[o]++
			}
			mu.Unlock()
		}
	})

	// Healthy seconds first, as in production: a breaker that weighs failures against the
	// successes before them would take long to open.
	time.Sleep(3 * time.Second)
	t.Cleanup(redis.Resume) // a failing test never leaves Redis stopped
	redis.Pause()
	paused.Store(true)
	time.Sleep(pauseFor)
	paused.Store(false)
	resumed := time.Now()
	redis.Resume()
	back := waitNormal(5 * time.Second)
	load.Stop()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d calls, slowest %v; while paused %v; normal decisions %v after SIGCONT", calls.Load(), slowest, duringPause, back)
	if n := slow.Load(); n > 0 {
		t.Errorf("%d of %d checks took longer than %v (slowest %v)", n, calls.Load(), deadline+margin, slowest)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d checks failed", n, calls.Load())
	}
	if duringPause[outcome{200, true, true}] == 0 || duringPause[outcome{200, true, false}] != 0 {
		t.Errorf("checks while Redis was paused: %v, want allowed and degraded", duringPause)
	}
	if back < 0 || back > 3*time.Second {
		t.Errorf("normal decisions %v after SIGCONT, want within 3 s", back)
	}
	if t.Failed() {
		t.Logf("paused %v, resumed %v; breaker changes:", resumed.Add(-pauseFor).Format(time.StampMilli), resumed.Format(time.StampMilli))
		for _, line := range strings.Split(node.log.String(), "\n") {
			if strings.Contains(line, "circuit breaker") {
				t.Log(line)
			}
		}
	}
}
