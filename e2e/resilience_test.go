package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testproxy"
)

const resiliencePolicy = `
rules:
  - {name: open, match: {endpoint: /open}, key: [user], algorithm: gcra, limit: 100000, period: 1s, on_store_error: open}
  - {name: closed, match: {endpoint: /closed}, key: [user], algorithm: gcra, limit: 100000, period: 1s, on_store_error: closed}
  - {name: local, match: {endpoint: /local}, key: [user], algorithm: fixed_window, limit: 5, period: 1h, on_store_error: local}
`

type outcome struct {
	status   int
	allowed  bool
	degraded bool
}

// loadUntil runs f(worker, iteration) on workers goroutines until stop closes.
func loadUntil(stop <-chan struct{}, wg *sync.WaitGroup, workers int, f func(g, i int)) {
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(g, i)
			}
		}()
	}
}

func call(client *http.Client, s *server, endpoint, user string) (outcome, error) {
	resp, err := client.Post("http://"+s.http+"/v1/check", "application/json",
		strings.NewReader(fmt.Sprintf(`{"user":%q,"endpoint":%q}`, user, endpoint)))
	if err != nil {
		return outcome{}, err
	}
	defer resp.Body.Close()
	var d struct{ Allowed, Degraded bool }
	json.NewDecoder(resp.Body).Decode(&d)
	return outcome{resp.StatusCode, d.Allowed, d.Degraded}, nil
}

// TestRedisKilledUnderLoad SIGKILLs Redis under a load on two sluice processes: no call fails,
// each rule follows its on_store_error while Redis is gone, and normal decisions come back
// after Redis restarts, with nothing restarted on Sluice's side.
func TestRedisKilledUnderLoad(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, resiliencePolicy)
	env := []string{"SLUICE_STORE=redis://" + redis.Addr, "SLUICE_STORE_TIMEOUT=300ms"}
	nodes := []*server{start(t, path, filepath.Join(dir, "a"), env...), start(t, path, filepath.Join(dir, "b"), env...)}

	var phase atomic.Int32 // 0 before the kill, 1 while Redis is dead, 2 after the restart
	var failed, calls atomic.Int64
	var mu sync.Mutex
	seen := map[string]map[outcome]int{} // "phase/endpoint" -> outcomes
	client := &http.Client{Timeout: 5 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loadUntil(stop, &wg, 12, func(g, i int) {
		endpoint := []string{"/open", "/closed", "/local"}[(g+i)%3]
		p := phase.Load()
		o, err := call(client, nodes[(g+i)%2], endpoint, fmt.Sprint("u", g))
		calls.Add(1)
		if err != nil || (o.status != 200 && o.status != 429) {
			failed.Add(1)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		k := fmt.Sprint(p, endpoint)
		if seen[k] == nil {
			seen[k] = map[outcome]int{}
		}
		seen[k][o]++
	})
	// gRPC callers too (sluice.v1 Check): no call may fail there either.
	var grpcCalls, grpcFailed atomic.Int64
	for n := range nodes {
		conn, err := grpc.NewClient(nodes[n].grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rl := sluicev1.NewRateLimiterClient(conn)
		loadUntil(stop, &wg, 2, func(g, _ int) {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := rl.Check(cctx, &sluicev1.CheckRequest{User: fmt.Sprint("g", g), Endpoint: "/open"})
			grpcCalls.Add(1)
			if err != nil {
				grpcFailed.Add(1)
			}
		})
	}
	time.Sleep(time.Second)
	redis.Kill()
	phase.Store(1)
	// The outage lasts until the local rule has had more calls than both nodes' local limits
	// together admit (12 users, 5 each per node), so that some user must be denied: a fixed
	// length would depend on how fast a loaded machine serves.
	outage := time.Now()
	for {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		local := 0
		for _, n := range seen["1/local"] {
			local += n
		}
		mu.Unlock()
		if (local > 2*12*5+30 && time.Since(outage) >= 2*time.Second) || time.Since(outage) > 20*time.Second {
			break
		}
	}
	redis.Restart(t)
	restarted := time.Now()
	phase.Store(2)
	// Normal decisions must come back by themselves: wait for a non-degraded answer.
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, err := call(client, nodes[0], "/closed", "probe")
		if err == nil && o.status == 200 && !o.degraded {
			t.Logf("normal decisions %v after Redis restarted", time.Since(restarted).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still degraded 10 s after Redis restarted: %+v %v", o, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	if f := failed.Load(); f != 0 {
		t.Errorf("%d of %d HTTP calls failed", f, calls.Load())
	}
	if f := grpcFailed.Load(); f != 0 || grpcCalls.Load() == 0 {
		t.Errorf("%d of %d gRPC calls failed", f, grpcCalls.Load())
	}
	t.Logf("%d HTTP and %d gRPC calls, none failed", calls.Load(), grpcCalls.Load())
	mu.Lock()
	defer mu.Unlock()
	for k, outs := range seen {
		t.Logf("%s: %v", k, outs)
	}
	// While Redis was dead, once the breaker decided: open allowed, closed denied, local
	// limited each node to the rule's own 5 per user and hour.
	if outs := seen["1/open"]; outs[outcome{200, true, true}] == 0 || outs[outcome{429, false, true}] != 0 {
		t.Errorf("open while Redis was dead: %v, want allowed and degraded", outs)
	}
	if outs := seen["1/closed"]; outs[outcome{429, false, true}] == 0 || outs[outcome{200, true, true}] != 0 {
		t.Errorf("closed while Redis was dead: %v, want denied and degraded", outs)
	}
	if outs := seen["1/local"]; outs[outcome{429, false, true}] == 0 || outs[outcome{200, true, true}] > 2*12*5 {
		t.Errorf("local while Redis was dead: %v, want each node to allow 5 per user", outs)
	}
	if outs := seen["2/closed"]; outs[outcome{200, true, false}] == 0 {
		t.Errorf("closed after Redis came back: %v, want normal decisions", outs)
	}
}

// TestOverloadIsRefusedFast saturates a node whose store answers slowly: requests past
// --max-inflight are refused at once with 503 instead of queueing, and the node stays small.
func TestOverloadIsRefusedFast(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	proxy := testproxy.Start(t, redis.Addr)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, resiliencePolicy)
	s := start(t, path, filepath.Join(dir, "data"), "SLUICE_STORE=redis://"+proxy.Addr, "SLUICE_STORE_TIMEOUT=2s", "SLUICE_MAX_INFLIGHT=64")
	proxy.Delay(2 * time.Second)

	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 400}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var decided, refused []time.Duration
	var other atomic.Int64
	for range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			o, err := call(client, s, "/open", "burst")
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				other.Add(1)
			case o.status == http.StatusServiceUnavailable:
				refused = append(refused, took)
			case o.status == 200:
				decided = append(decided, took)
			default:
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	slices.Sort(decided)
	slices.Sort(refused)
	if len(refused) == 0 || len(decided) == 0 || other.Load() != 0 {
		t.Fatalf("decided %d, refused %d, other %d: want both decided and refused, nothing else", len(decided), len(refused), other.Load())
	}
	medianRefused, medianDecided := refused[len(refused)/2], decided[len(decided)/2]
	t.Logf("400 at once, 64 in flight at most: %d decided (median %v), %d refused (median %v)",
		len(decided), medianDecided.Round(time.Millisecond), len(refused), medianRefused.Round(time.Millisecond))
	// A refusal waits for no store call (2 s each here) and no free slot; compared with the
	// decided requests of the same run, so the client's own cost on a loaded machine cancels.
	if medianRefused >= medianDecided {
		t.Errorf("median refusal %v is no faster than the median decision %v", medianRefused, medianDecided)
	}
	m := s.get("/metrics")
	if !strings.Contains(m, `sluice_requests_rejected_total{api="http",reason="overloaded"}`) {
		t.Errorf("refusals not counted:\n%s", grepLines(m, "rejected"))
	}
	// Memory stays bounded: refused requests hold nothing. (A race-built binary is several
	// times larger than a release one; the bound is generous but catches queueing.)
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, "process_resident_memory_bytes "); ok {
			var rss float64
			fmt.Sscan(v, &rss)
			t.Logf("resident memory after the burst: %.0f MiB", rss/(1<<20))
			if rss > 512<<20 {
				t.Errorf("resident memory %.0f MiB after a burst of 400", rss/(1<<20))
			}
		}
	}
}

// TestHotKeyModeIsVisible runs a node with --hot-keys on Redis and drives a user and an
// endpoint hot: /v1/quota says hot_key, and the metrics count the local decisions. Other
// users on the hot endpoint are then decided in part locally (the endpoint's limit) and in
// part by the store (their own), which the metrics count as mixed decisions.
func TestHotKeyModeIsVisible(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, "rules:\n  - {name: hot, key: [user], algorithm: fixed_window, limit: 1000000, period: 1h}\n"+
		"  - {name: per-endpoint, key: [endpoint], algorithm: fixed_window, limit: 1000000, period: 1h}\n")
	s := start(t, path, filepath.Join(dir, "data"), "SLUICE_STORE=redis://"+redis.Addr, "SLUICE_STORE_TIMEOUT=2s",
		"SLUICE_HOT_KEYS=true", "SLUICE_HOT_KEY_THRESHOLD=50")
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Post("http://"+s.http+"/v1/quota", "application/json", strings.NewReader(`{"user":"celebrity","endpoint":"/"}`))
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			HotKey bool `json:"hot_key"`
		}
		json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if d.HotKey {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key never became hot in /v1/quota")
		}
		for range 50 {
			call(client, s, "/", "celebrity")
		}
	}
	if m := s.get("/metrics"); !strings.Contains(m, "sluice_hot_keys 2") || !strings.Contains(m, `mode="hot_key"`) {
		t.Errorf("metrics do not show hot-key mode:\n%s", grepLines(m, "hot"))
	}
	for i := range 20 {
		// The celebrity's requests go on between the fans', at the rate that made "/" hot:
		// a key asked for at less than half the threshold goes back to the store, and on a
		// loaded machine 20 fans alone can be that slow.
		for range 10 {
			call(client, s, "/", "celebrity")
		}
		o, err := call(client, s, "/", "fan-"+strconv.Itoa(i))
		if err != nil || !o.allowed {
			t.Fatalf("fan %d: %+v, %v", i, o, err)
		}
	}
	m := s.get("/metrics")
	var mixed float64
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, "sluice_hot_key_mixed_decisions_total "); ok {
			fmt.Sscan(v, &mixed)
		}
	}
	if mixed < 20 {
		t.Errorf("%v mixed decisions, want the 20 fans' requests:\n%s", mixed, grepLines(m, "hot"))
	}
}

// TestAllowancesAreExactOnOneNode runs a node with --allowances on Redis and spends a user's
// limit through it: every answer and remaining is the one the store alone gives, most requests
// are decided from the units the node holds, and a second node then finds the limit spent.
func TestAllowancesAreExactOnOneNode(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, "rules:\n  - {name: per-user, key: [user], algorithm: fixed_window, limit: 320, period: 24h}\n")
	env := []string{"SLUICE_STORE=redis://" + redis.Addr, "SLUICE_STORE_TIMEOUT=2s", "SLUICE_ALLOWANCES=true"}
	a := start(t, path, filepath.Join(dir, "a"), env...)
	client := &http.Client{Timeout: 5 * time.Second}
	check := func(s *server) (allowed bool, remaining int64) {
		t.Helper()
		resp, err := client.Post("http://"+s.http+"/v1/check", "application/json", strings.NewReader(`{"user":"spender"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct {
			Allowed   bool
			Remaining int64
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return d.Allowed, d.Remaining
	}
	for i := range int64(330) {
		allowed, remaining := check(a)
		if want := i < 320; allowed != want || remaining != max(0, 319-i) {
			t.Fatalf("request %d: allowed %v with %d left, want %v with %d", i+1, allowed, remaining, want, max(0, 319-i))
		}
	}
	m := a.get("/metrics")
	var local float64
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, `sluice_allowance_decisions_total{where="node"} `); ok {
			fmt.Sscan(v, &local)
		}
	}
	if local < 160 {
		t.Errorf("%v requests decided from held units, want most of 320:\n%s", local, grepLines(m, "allowance"))
	}
	b := start(t, path, filepath.Join(dir, "b"), env...)
	if allowed, remaining := check(b); allowed || remaining != 0 {
		t.Errorf("a second node: allowed %v with %d left, want the limit spent", allowed, remaining)
	}
}

// TestClusterFailover kills a Redis Cluster primary under load on a sluice process: while the
// replica is promoted, checks keep answering (by on_store_error), and once the cluster is ok
// again sluice follows the new topology and decides normally, with no restart.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, resiliencePolicy)
	s := start(t, path, filepath.Join(dir, "data"), "SLUICE_STORE=redis-cluster://"+strings.Join(cl.Addrs, ","), "SLUICE_STORE_TIMEOUT=500ms")

	var failed, calls, degraded atomic.Int64
	client := &http.Client{Timeout: 5 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loadUntil(stop, &wg, 8, func(g, i int) {
		// Many users: their keys spread over every primary's slots.
		o, err := call(client, s, "/open", fmt.Sprint("user-", g, "-", i%50))
		calls.Add(1)
		switch {
		case err != nil || o.status != 200:
			failed.Add(1)
		case o.degraded:
			degraded.Add(1)
		}
	})
	time.Sleep(time.Second)
	// The primary that owns a key accepts a write to it; the others answer MOVED.
	var primary *redistest.Server
	for _, n := range cl.Nodes {
		if _, err := n.Do("SET", "failover-probe", "1"); err == nil {
			primary = n
			break
		}
	}
	if primary == nil {
		t.Fatal("no node accepted a write")
	}
	killed := time.Now()
	primary.Kill()
	cl.WaitOK(t)
	promoted := time.Since(killed)
	// Normal decisions for every user again: a full round with nothing degraded.
	deadline := time.Now().Add(20 * time.Second)
	for {
		clean := true
		for u := range 50 {
			o, err := call(client, s, "/open", fmt.Sprint("probe-", u))
			if err != nil || o.status != 200 || o.degraded {
				clean = false
				break
			}
		}
		if clean {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("decisions still degraded 20 s after the cluster recovered")
		}
		time.Sleep(100 * time.Millisecond)
	}
	recovered := time.Since(killed)
	close(stop)
	wg.Wait()
	t.Logf("primary killed: cluster ok after %v, normal decisions after %v; %d calls, %d degraded, %d failed",
		promoted.Round(time.Millisecond), recovered.Round(time.Millisecond), calls.Load(), degraded.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d calls failed during the failover", failed.Load(), calls.Load())
	}
}
