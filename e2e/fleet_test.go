package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// fleetPolicy has one exact algorithm per endpoint, each with a bound that 64 clients exceed
// several times over in the test's 3 s and that its window or refill does not move: the
// buckets refill 80 an hour (0.07 token in 3 s), and the fixed window is the longest allowed
// (an hour's rolls over at the top of the hour, on the wall clock).
const fleetPolicy = `
rules:
  - {name: fw, match: {endpoint: /fw}, key: [user], algorithm: fixed_window, limit: 100, period: 9600h}
  - {name: tb, match: {endpoint: /tb}, key: [user], algorithm: token_bucket, limit: 80, period: 1h}
  - {name: gcra, match: {endpoint: /gcra}, key: [user], algorithm: gcra, limit: 80, period: 1h}
  - {name: lb, match: {endpoint: /lb}, key: [user], algorithm: leaky_bucket, limit: 80, period: 1h}
  - {name: swl, match: {endpoint: /swl}, key: [user], algorithm: sliding_window_log, limit: 100, period: 1h}
`

var fleetBounds = map[string]int64{"/fw": 100, "/tb": 80, "/gcra": 80, "/lb": 80, "/swl": 100}

// fleet runs 3 sluice processes on storeURL and 64 clients spread over them, hammering 2 hot
// users on every endpoint until each was offered twice its bound, and checks that each exact limit admitted no more than its
// bound and at least 99% of it.
func fleet(t *testing.T, storeURL string) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, fleetPolicy)
	var nodes []*server
	for i := range 3 {
		// A healthy but race-built fleet on two shared cores answers slower than the default
		// 10 ms store deadline; past it rules fail open, which is not what this test measures.
		nodes = append(nodes, start(t, path, filepath.Join(dir, fmt.Sprint("data", i)), "SLUICE_STORE="+storeURL, "SLUICE_STORE_TIMEOUT=2s"))
	}
	endpoints := []string{"/fw", "/tb", "/gcra", "/lb", "/swl"}
	users := []string{"hot-1", "hot-2"}
	var admitted sync.Map // endpoint+user -> *atomic.Int64
	for _, e := range endpoints {
		for _, u := range users {
			admitted.Store(e+u, new(atomic.Int64))
		}
	}
	var failed, calls atomic.Int64
	var offered sync.Map // endpoint+user -> *atomic.Int64
	for _, e := range endpoints {
		for _, u := range users {
			offered.Store(e+u, new(atomic.Int64))
		}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second}
	// Run until every key was offered twice its bound (at most 20 s): a loaded machine sends
	// fewer requests a second, and the bound must be exceeded to be tested.
	var done atomic.Bool
	go func() {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			enough := true
			for _, e := range endpoints {
				for _, u := range users {
					o, _ := offered.Load(e + u)
					if o.(*atomic.Int64).Load() < 2*fleetBounds[e] {
						enough = false
					}
				}
			}
			if enough {
				break
			}
		}
		done.Store(true)
	}()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load(); i++ {
				n := nodes[(g+i)%len(nodes)]
				e, u := endpoints[(g+i)%len(endpoints)], users[(g/2+i)%len(users)]
				resp, err := client.Post("http://"+n.http+"/v1/check", "application/json",
					strings.NewReader(fmt.Sprintf(`{"user":%q,"endpoint":%q}`, u, e)))
				calls.Add(1)
				o, _ := offered.Load(e + u)
				o.(*atomic.Int64).Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				var d struct{ Allowed bool }
				json.NewDecoder(resp.Body).Decode(&d)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200 && d.Allowed:
					c, _ := admitted.Load(e + u)
					c.(*atomic.Int64).Add(1)
				case resp.StatusCode != 429:
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d of %d calls failed", f, calls.Load())
	}
	for _, e := range endpoints {
		for _, u := range users {
			c, _ := admitted.Load(e + u)
			got, bound := c.(*atomic.Int64).Load(), fleetBounds[e]
			o, _ := offered.Load(e + u)
			t.Logf("%s %s: admitted %d of bound %d (%d offered)", e, u, got, bound, o.(*atomic.Int64).Load())
			if o.(*atomic.Int64).Load() < bound*3/2 {
				t.Errorf("%s %s: only %d requests offered; the load is too light to test a bound of %d", e, u, o.(*atomic.Int64).Load(), bound)
			}
			if got > bound || got < bound*99/100 {
				t.Errorf("%s %s: admitted %d, want between %d and %d", e, u, got, bound*99/100, bound)
			}
		}
	}
	t.Logf("%d calls through 3 nodes", calls.Load())
	// A decision that failed open (the store past its deadline) is not the store's: over the
	// bound, it would be, and it would hide a store that double counts.
	for i, n := range nodes {
		plain, routed := 0.0, ""
		for _, line := range strings.Split(n.get("/metrics"), "\n") {
			if strings.HasPrefix(line, "sluice_checks_total{") && strings.Contains(line, `mode="fallback"`) {
				t.Errorf("node %d decided without the store: %s", i, line)
			}
			if v, ok := strings.CutPrefix(line, `sluice_redis_plain_batches_total{outcome="decided"} `); ok {
				plain, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(line, "sluice_redis_cluster_routed_slots "); ok {
				routed = v
			}
		}
		// The fixed window, far from its bound for most of the run, is counted with plain
		// commands; on a Cluster, straight at every slot's primary.
		if plain == 0 {
			t.Errorf("node %d: no batch decided with plain commands", i)
		}
		if strings.HasPrefix(storeURL, "redis-cluster://") && routed != "16384" {
			t.Errorf("node %d: %q slots routed to their primary, want 16384", i, routed)
		}
	}
}

func TestFleetOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	fleet(t, "redis://"+srv.Addr)
}

func TestFleetOnRedisCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	fleet(t, "redis-cluster://"+strings.Join(cl.Addrs, ","))
}
