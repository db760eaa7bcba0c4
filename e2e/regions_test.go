package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testproxy"
)

// regionsPolicy has one rule per endpoint, so each request meets exactly one limit:
//   - /quota: the 1-minute global limit of the accuracy runs, 3,000 a minute;
//   - /burst: a 20-second global limit for the partition, so it is reached in a few seconds;
//   - /keys: a global limit per user that is never reached, for the bytes per active key;
//   - /home: 10 a second decided in region us;
//   - /local: a per-region limit, the baseline of the latency comparison.
const regionsPolicy = `
rules:
  - {name: quota, match: {endpoint: /quota}, key: [], algorithm: fixed_window, limit: 3000, period: 1m, regions: global}
  - {name: burst, match: {endpoint: /burst}, key: [], algorithm: fixed_window, limit: 1000, period: 20s, regions: global}
  - {name: keys, match: {endpoint: /keys}, key: [user], algorithm: fixed_window, limit: 1000000, period: 1h, regions: global}
  - {name: home, match: {endpoint: /home}, key: [], algorithm: fixed_window, limit: 10, period: 1s, regions: "home:us"}
  - {name: local, match: {endpoint: /local}, key: [user], algorithm: fixed_window, limit: 1000000, period: 1h}
`

// regionToken is the region token every node of the tests' regions shares.
const regionToken = "e2e-region-token-0123456789"

// regionSync is the --region-sync of every run.
const regionSync = 100 * time.Millisecond

// regionShares is how the offered load splits across the regions, in the order of
// regionNames: the simulation's 50/30/20.
var (
	regionNames  = []string{"us", "eu", "ap"}
	regionShares = []float64{0.5, 0.3, 0.2}
)

// regionNode is one region: a sluice serve, its client and the proxies its links to the
// other regions go through (out[b] carries this region's calls to b).
type regionNode struct {
	name string
	srv  *server
	rl   sluicev1.RateLimiterClient
	out  map[string]*testproxy.Proxy
}

// regionSet is three regions on loopback: us on a real Redis, eu and ap on the memory store,
// every link through a proxy that adds delay one way (so a round trip is twice it) and can cut.
type regionSet struct {
	delay time.Duration
	nodes []*regionNode // in the order of regionNames
}

// startRegionSet starts the three regions of a set with policy at path, every link delayed by
// delay.
func startRegionSet(t *testing.T, path string, delay time.Duration) *regionSet {
	t.Helper()
	redis := redistest.Start(t)
	set := &regionSet{delay: delay}
	// The proxies exist before the servers, whose --regions name them; each learns its
	// upstream once that server listens (until then a dial fails and gRPC retries within a
	// sync).
	for _, a := range regionNames {
		n := &regionNode{name: a, out: map[string]*testproxy.Proxy{}}
		for _, b := range regionNames {
			if a != b {
				n.out[b] = testproxy.Start(t, "127.0.0.1:1")
				n.out[b].Delay(delay)
			}
		}
		set.nodes = append(set.nodes, n)
	}
	for _, n := range set.nodes {
		var peers []string
		for _, b := range regionNames {
			if b != n.name {
				peers = append(peers, b+"="+n.out[b].Addr)
			}
		}
		var env []string
		if n.name == "us" {
			env = append(env, "SLUICE_STORE=redis://"+redis.Addr)
		}
		n.start(t, path, strings.Join(peers, ","), env...)
	}
	for _, a := range set.nodes {
		for _, b := range set.nodes {
			if a != b {
				a.out[b.name].SetUpstream(b.srv.grpc)
			}
		}
	}
	for _, n := range set.nodes {
		for b := range n.out {
			waitFor(t, 15*time.Second, n.name+" sees "+b+" up", func() bool { return regionGauge(n.srv, "sluice_region_peer_up", b) == 1 })
		}
	}
	return set
}

// start starts n as a real sluice serve of the policy at path in region n.name, its peers
// NAME=ADDR,..., with env added, and dials its gRPC port.
func (n *regionNode) start(t *testing.T, path, peers string, env ...string) {
	t.Helper()
	extra := []string{"--region", n.name, "--regions", peers, "--region-sync", regionSync.String()}
	// A race-built node on two shared cores may answer slower than the default store
	// deadline; past it rules fail open, which is not what these tests measure.
	env = append(env, "SLUICE_STORE_TIMEOUT=10s", "SLUICE_REGION_TOKEN="+regionToken)
	n.srv = startWith(t, binary, path, t.TempDir(), extra, http.DefaultClient, "http", env...)
	conn, err := grpc.NewClient(n.srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n.rl = sluicev1.NewRateLimiterClient(conn)
}

// node returns the region called name.
func (s *regionSet) node(name string) *regionNode {
	for _, n := range s.nodes {
		if n.name == name {
			return n
		}
	}
	panic("no region " + name)
}

// cut cuts (or heals) every link from and to region name, both directions.
func (s *regionSet) cut(name string, on bool) {
	for _, n := range s.nodes {
		for b, p := range n.out {
			if n.name == name || b == name {
				p.Cut(on)
			}
		}
	}
}

// stop stops the set's servers, to spare the machine once a test is done with them.
func (s *regionSet) stop() {
	for _, n := range s.nodes {
		n.srv.stop()
	}
}

// bytes returns what every link of the set forwarded so far, both directions.
func (s *regionSet) bytes() int64 {
	var sum int64
	for _, n := range s.nodes {
		for _, p := range n.out {
			sum += p.Bytes()
		}
	}
	return sum
}

var gaugeLine = regexp.MustCompile(`(?m)^(\S+)\{region="([^"]+)"\} (\S+)$`)

// regionGauge reads name{region=peer} from s's /metrics; NaN when it is missing.
func regionGauge(s *server, name, peer string) float64 {
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return math.NaN()
	}
	for _, m := range gaugeLine.FindAllStringSubmatch(string(body), -1) {
		if m[1] == name && m[2] == peer {
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				return math.NaN()
			}
			return v
		}
	}
	return math.NaN()
}

// regionLoad is what one region's share of a load saw.
type regionLoad struct {
	// admitted includes degraded: a decision the store failed, made by on_store_error (open).
	// With loadSpec.window, admitted counts the measured window only, and later the rest.
	// inWindow counts the decisions, allowed or denied, made in the measured window.
	offered, admitted, degraded, later, inWindow, failed atomic.Int64
	firstErr                                             atomic.Value // string
}

// loadSpec is a load to drive: rate requests a second in all, split by regionShares, built
// by req (i counts the region's requests from 0), for dur.
type loadSpec struct {
	rate float64
	dur  time.Duration
	req  func(region string, i int64) *sluicev1.CheckRequest
	// onAllowed, when set, is told of every admitted request: when it was sent, when the
	// answer came and the answer's reset.
	onAllowed func(sent, received time.Time, resetAfter time.Duration)
	// window and windowEnd, when set, make admitted count only the decisions of the window
	// of length window that ends at windowEnd: a late answer on a loaded machine may be
	// decided in the next window, which has room again.
	window    time.Duration
	windowEnd time.Time
}

// decidedIn returns the end of the window of length period that a decision with reset after
// it, sent at sent, was made in: the decision came after sending, so the window's end is the
// first multiple of period at or after sent+reset, as long as the call took less than a
// period. The 50 ms of slack cover reset's rounding up to the millisecond and a store whose
// clock reads a little behind (Redis's scripts count in milliseconds).
func decidedIn(sent time.Time, reset, period time.Duration) time.Time {
	return sent.Add(reset - 50*time.Millisecond).Add(period - 1).Truncate(period)
}

// drive sends the load on the set, each region's requests paced evenly at its share of the
// rate by a few workers (a slow answer does not hold the next request back), and returns what
// each region saw once every call has ended.
func (s *regionSet) drive(spec loadSpec) []*regionLoad {
	const workers = 8
	out := make([]*regionLoad, len(s.nodes))
	var wg sync.WaitGroup
	begin := time.Now()
	for ri, n := range s.nodes {
		ld := &regionLoad{}
		out[ri] = ld
		rate := spec.rate * regionShares[ri]
		var next atomic.Int64
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					due := begin.Add(time.Duration(float64(i) / rate * float64(time.Second)))
					if due.Sub(begin) >= spec.dur {
						return
					}
					time.Sleep(time.Until(due))
					ld.offered.Add(1)
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					t0 := time.Now()
					resp, err := n.rl.Check(ctx, spec.req(n.name, i))
					t1 := time.Now()
					cancel()
					if err == nil && spec.window > 0 {
						reset := time.Duration(resp.ResetAfterMs) * time.Millisecond
						if resp.Allowed && decidedIn(t0, reset, spec.window).Equal(spec.windowEnd) || !resp.Allowed && t1.Before(spec.windowEnd) {
							ld.inWindow.Add(1)
						}
					}
					switch {
					case err != nil:
						ld.failed.Add(1)
						ld.firstErr.CompareAndSwap(nil, err.Error())
					case resp.Allowed:
						reset := time.Duration(resp.ResetAfterMs) * time.Millisecond
						if spec.window > 0 && !decidedIn(t0, reset, spec.window).Equal(spec.windowEnd) {
							ld.later.Add(1)
							break
						}
						if resp.Degraded {
							ld.degraded.Add(1)
						}
						ld.admitted.Add(1)
						if spec.onAllowed != nil {
							spec.onAllowed(t0, t1, time.Duration(resp.ResetAfterMs)*time.Millisecond)
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	return out
}

// totals sums the regions' loads.
func totals(loads []*regionLoad) (offered, admitted, failed int64) {
	for _, l := range loads {
		offered += l.offered.Load()
		admitted += l.admitted.Load()
		failed += l.failed.Load()
	}
	return offered, admitted, failed
}

// underAdmission is how far the window's admissions fell below limit, in percent of it. An
// admission a loaded machine decided only after the window ended (regionLoad.later) was a
// request the window never got to decide in time: it could have been one of the window's, so
// it is not held against the regions.
func underAdmission(limit int64, loads []*regionLoad) float64 {
	_, admitted, _ := totals(loads)
	for _, l := range loads {
		admitted += l.later.Load()
	}
	return max(0, float64(limit-admitted)) / float64(limit) * 100
}

// inWindow sums the regions' decisions made in the measured window.
func inWindow(loads []*regionLoad) int64 {
	var n int64
	for _, l := range loads {
		n += l.inWindow.Load()
	}
	return n
}

// checkNoFailures fails the test for any call that failed, and logs the decisions made
// degraded (the store failed; on_store_error decided).
func checkNoFailures(t *testing.T, what string, loads []*regionLoad) {
	t.Helper()
	for i, l := range loads {
		if n := l.later.Load(); n > 0 {
			t.Logf("%s: %d calls to %s were admitted late, in the next window: not counted, nor held against under-admission", what, n, regionNames[i])
		}
		if n := l.failed.Load(); n > 0 {
			t.Errorf("%s: %d calls failed in %s, first: %v", what, n, regionNames[i], l.firstErr.Load())
		}
		if n := l.degraded.Load(); n > 0 {
			t.Logf("%s: %d decisions in %s were degraded (its store failed; fail open), counted as admitted", what, n, regionNames[i])
		}
	}
}

// waitWindow sleeps until a window of period has at least need left, and returns when that
// window started.
func waitWindow(period, need time.Duration) time.Time {
	now := time.Now()
	start := now.Truncate(period)
	if start.Add(period).Sub(now) >= need {
		return start
	}
	// A little past the boundary, so no request of the run is decided in the window before.
	time.Sleep(time.Until(start.Add(period + 20*time.Millisecond)))
	return start.Add(period)
}

// TestRegions runs three regions, each a real sluice serve (us on Redis), through delaying
// proxies: a global 1-minute limit's overage and under-admission at 0, 50 and 150 ms one-way
// delay; a partition of one region under load; the home mode's exact per-second limit; and it
// logs the extra latency of global and home decisions and the sync's bytes per active key.
func TestRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nine sluice processes for about two minutes")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, regionsPolicy)
	delays := []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond}
	sets := make([]*regionSet, len(delays))
	for i, d := range delays {
		sets[i] = startRegionSet(t, path, d)
	}
	t.Run("Unauthenticated", func(t *testing.T) { regionsUnauthenticated(t, sets[0]) })
	t.Run("Accuracy", func(t *testing.T) { regionsAccuracy(t, sets) })
	sets[2].stop() // the rest runs on the first two sets
	t.Run("Partition", func(t *testing.T) { regionsPartition(t, sets[0]) })
	t.Run("Home", func(t *testing.T) { regionsHome(t, sets[1]) })
	t.Run("Latency", func(t *testing.T) { regionsLatency(t, sets[1]) })
	t.Run("Bytes", func(t *testing.T) { regionsBytes(t, sets[0]) })
}

// regionsUnauthenticated calls a node's Regions service without the region token and with
// another: both refused, and the counts sent are not taken.
func regionsUnauthenticated(t *testing.T, s *regionSet) {
	n := s.node("eu")
	for name, tok := range map[string]string{"no token": "", "another token": "e2e-region-token-0123456780"} {
		md := metadata.MD{}
		if tok != "" {
			md.Set("authorization", "Bearer "+tok)
		}
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
		conn, err := grpc.NewClient(n.srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		_, err = sluicev1.NewRegionsClient(conn).Sync(ctx, &sluicev1.SyncRequest{Region: "us", Counts: []*sluicev1.WindowCount{{Key: []byte("sl:quota:1:x"), WindowStartUs: 1, Count: 1e9}}})
		cancel()
		conn.Close()
		if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != "unauthenticated" {
			t.Errorf("%s: Sync answered %v, want Unauthenticated and nothing more", name, err)
		}
	}
}

// regionsAccuracy offers 3× the 1-minute limit (3,000) split 50/30/20 on the three sets at
// once, starting early enough in a window to end 10 s before it: the limit is reached about
// 20 s after the start. The load goes on 16 s more, as real demand would to the window's end:
// regions near the limit take only their share of what is left (store/region's remote), so on
// a busy machine, where syncs arrive a second late, the last units of the limit take seconds
// to be admitted (with 6 s, 0.3-0.9% stayed unadmitted at load 26). By the end every region
// has seen the others' final counts and their rates have decayed (time constant 0.5 s), so the
// window admits nothing more.
func regionsAccuracy(t *testing.T, sets []*regionSet) {
	const (
		limit = 3000
		run   = 36 * time.Second
	)
	rate := 3 * float64(limit) / 60
	// 10 s to spare: on a loaded machine the last calls may be answered late.
	start := waitWindow(time.Minute, run+10*time.Second)
	t.Logf("load starts %v into the window", time.Since(start).Round(time.Millisecond))
	results := make([][]*regionLoad, len(sets))
	var wg sync.WaitGroup
	// Halfway, each node's lag behind each peer: how old the counts it decides with are.
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(run / 2)
		for _, s := range sets {
			var lags []string
			for _, n := range s.nodes {
				for _, b := range regionNames {
					if b != n.name {
						lags = append(lags, fmt.Sprintf("%s→%s %.0fms", b, n.name, 1000*regionGauge(n.srv, "sluice_region_lag_seconds", b)))
					}
				}
			}
			t.Logf("delay %v, lag halfway: %s", s.delay, strings.Join(lags, ", "))
		}
	}()
	for i, s := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.drive(loadSpec{rate: rate, dur: run, window: time.Minute, windowEnd: start.Add(time.Minute),
				req: func(string, int64) *sluicev1.CheckRequest { return &sluicev1.CheckRequest{Endpoint: "/quota"} }})
		}()
	}
	wg.Wait()
	t.Logf("sync %v, limit %d a minute, offered 3× split 50/30/20:", regionSync, limit)
	t.Logf("%-10s %9s %10s %9s %15s %8s %10s", "delay", "offered", "in window", "admitted", "us/eu/ap", "overage", "under-adm.")
	for i, s := range sets {
		offered, admitted, failed := totals(results[i])
		over := max(0, float64(admitted-limit)) / limit * 100
		under := underAdmission(limit, results[i])
		per := fmt.Sprintf("%d/%d/%d", results[i][0].admitted.Load(), results[i][1].admitted.Load(), results[i][2].admitted.Load())
		t.Logf("%-10v %9d %10d %9d %15s %7.2f%% %9.2f%%", s.delay, offered, inWindow(results[i]), admitted, per, over, under)
		checkNoFailures(t, fmt.Sprintf("delay %v", s.delay), results[i])
		if failed > 0 {
			continue
		}
		if over > 0.1 {
			t.Errorf("delay %v: overage %.2f%%, want at most 0.1%%", s.delay, over)
		}
		// Under-admission is judged only when the window saw the load press on the limit: a
		// machine too loaded to send it in time leaves room that no region was asked to fill.
		if in := inWindow(results[i]); in < limit*6/5 {
			t.Logf("delay %v: only %d decisions in the window (the load fell behind): under-admission not judged", s.delay, in)
		} else if under > 0.5 {
			t.Errorf("delay %v: under-admission %.2f%%, want at most 0.5%%", s.delay, under)
		}
	}
}

// regionsPartition offers 3× the 20-second limit (1,000) and cuts every link of eu for 5 s
// around the moment the limit is reached: nothing may fail; the window's admissions must stay
// near the limit (each side assumes the other's last rate while it hears nothing); and after
// the heal every region must hold eu's counts, and eu theirs, about as soon as any sync.
func regionsPartition(t *testing.T, s *regionSet) {
	const (
		limit  = 1000
		period = 20 * time.Second
		run    = 13 * time.Second
	)
	rate := 3 * float64(limit) / period.Seconds() // the limit is reached 6.7 s in
	start := waitWindow(period, run+time.Second)
	var loads []*regionLoad
	done := make(chan struct{})
	go func() {
		defer close(done)
		loads = s.drive(loadSpec{rate: rate, dur: run, window: period, windowEnd: start.Add(period),
			req: func(string, int64) *sluicev1.CheckRequest { return &sluicev1.CheckRequest{Endpoint: "/burst"} }})
	}()
	time.Sleep(3 * time.Second)
	s.cut("eu", true)
	time.Sleep(5 * time.Second)
	healed := time.Now()
	s.cut("eu", false)
	// Converged once each side received a sync from the other after the heal: it carries
	// every count the partition held back (a failed send is sent again whole). The lag says
	// when that sync arrived (the set's links add no delay), so the scrapes' own slowness does
	// not count.
	var took time.Duration
	var pairs []string
	for _, n := range s.nodes {
		for b := range n.out {
			if n.name != "eu" && b != "eu" {
				continue
			}
			var arrived time.Time
			waitFor(t, 10*time.Second, n.name+" hears from "+b+" after the heal", func() bool {
				now := time.Now()
				lag := regionGauge(n.srv, "sluice_region_lag_seconds", b)
				arrived = now.Add(-time.Duration(lag * float64(time.Second)))
				return lag < now.Sub(healed).Seconds()
			})
			took = max(took, arrived.Sub(healed))
			pairs = append(pairs, fmt.Sprintf("%s→%s %v", b, n.name, arrived.Sub(healed).Round(time.Millisecond)))
		}
	}
	t.Logf("first sync after the heal: %s", strings.Join(pairs, ", "))
	<-done
	offered, admitted, _ := totals(loads)
	over := max(0, float64(admitted-limit)) / limit * 100
	under := underAdmission(limit, loads)
	if in := inWindow(loads); in < limit*6/5 {
		t.Logf("partition: only %d decisions in the window (the load fell behind): under-admission not judged", in)
		under = 0
	}
	t.Logf("partition of eu for 5 s: offered %d, admitted %d (us %d, eu %d, ap %d): overage %.2f%%, under-admission %.2f%%; converged %v after the heal (sync %v)",
		offered, admitted, loads[0].admitted.Load(), loads[1].admitted.Load(), loads[2].admitted.Load(), over, under, took.Round(time.Millisecond), regionSync)
	checkNoFailures(t, "partition", loads)
	// Each side reserves the other's last rate while it hears nothing, and regions near the
	// limit take only their share of what is left, so the window stays near the limit
	// (store/region's TestPartitionSimulation: within 1% wherever the cut falls, on a busy
	// machine's late syncs and bursts of load too). CI on loaded machines saw 6.3% and 7.3%
	// over before the share (issue 32).
	if over > 5 || under > 5 {
		t.Errorf("partition: admitted %d of %d, want at most 5%% over and 5%% under", admitted, limit)
	}
	// A healed link reconnects within half a sync (gRPC's backoff is capped there) and syncs
	// at once: about a sync on an idle machine. Race-built processes on two cores shared with
	// other work were seen to take seconds before the reconnect kick; the bound still fails a
	// link that waits out gRPC's default backoff (1 s, growing to 2 minutes).
	if bound := 3 * time.Second; took > bound {
		t.Errorf("converged %v after the heal, want within %v", took, bound)
	}
}

// regionsHome offers 60 requests a second across the regions to a 10-a-second limit homed in
// us, through 50 ms links: every whole second must admit exactly 10, whichever region asked.
func regionsHome(t *testing.T, s *regionSet) {
	const run = 4500 * time.Millisecond
	var mu sync.Mutex
	perWindow := map[int64]int{}
	// unsure holds the windows an admitted call may have been decided in when its span
	// (sending to answer, plus the slack of decidedIn) held two whole seconds: on a loaded
	// machine a call can take that long, and such windows cannot be counted exactly.
	unsure := map[int64]bool{}
	start := time.Now()
	loads := s.drive(loadSpec{rate: 60, dur: run, req: func(string, int64) *sluicev1.CheckRequest {
		return &sluicev1.CheckRequest{Endpoint: "/home"}
	}, onAllowed: func(sent, received time.Time, reset time.Duration) {
		// The window the home decided in ends reset after its decision, which came between
		// sending and receiving; reset is rounded up to the millisecond. While the call took
		// less than a second, one whole second lies in that span: the window's end.
		end := decidedIn(sent, reset, time.Second)
		mu.Lock()
		defer mu.Unlock()
		if latest := received.Add(reset); !end.Add(time.Second).After(latest) || end.After(latest) {
			unsure[end.Unix()], unsure[end.Unix()+1] = true, true
			return
		}
		perWindow[end.Unix()]++
	}})
	checkNoFailures(t, "home", loads)
	// Whole seconds only: from the first that began after the load did to the last that ended
	// before it stopped.
	first, last := start.Truncate(time.Second).Unix()+2, start.Add(run).Truncate(time.Second).Unix()
	var counts []int
	judged := 0
	for end := first; end <= last; end++ {
		counts = append(counts, perWindow[end])
		if unsure[end] {
			t.Logf("window ending %s: a call took about a second, so its window is not judged", time.Unix(end, 0).Format("15:04:05"))
			continue
		}
		judged++
		if perWindow[end] != 10 {
			t.Errorf("window ending %s admitted %d, want exactly 10", time.Unix(end, 0).Format("15:04:05"), perWindow[end])
		}
	}
	if judged == 0 && len(counts) > 0 {
		t.Logf("no whole second could be judged: every one held a call of about a second (a loaded machine)")
	}
	t.Logf("home:us, 10 a second, 60 a second offered across us/eu/ap: whole seconds admitted %v (us %d, eu %d, ap %d in all)",
		counts, loads[0].admitted.Load(), loads[1].admitted.Load(), loads[2].admitted.Load())
	if len(counts) < 3 {
		t.Errorf("only %d whole seconds measured", len(counts))
	}
}

// regionsLatency compares, in eu with 50 ms links, the decision latency of a per-region rule,
// a global rule and a rule homed in us: global needs no cross-region call, home one round trip.
func regionsLatency(t *testing.T, s *regionSet) {
	eu := s.node("eu")
	const n = 100
	// A degraded answer is one whose store (for /home, the home region's Decide) did not
	// answer in time; on two overloaded cores a few do. More than 5 in 100 is a fault.
	degraded := map[string]int{}
	measure := func(endpoint string) (p50, p99 time.Duration) {
		lat := make([]time.Duration, 0, n)
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t0 := time.Now()
			resp, err := eu.rl.Check(ctx, &sluicev1.CheckRequest{Endpoint: endpoint, User: fmt.Sprint("lat-", i)})
			lat = append(lat, time.Since(t0))
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", endpoint, err)
			}
			if resp.Degraded {
				degraded[endpoint]++
			}
		}
		slices.Sort(lat)
		return lat[n/2], lat[n*99/100]
	}
	l50, l99 := measure("/local")
	g50, g99 := measure("/keys")
	h50, h99 := measure("/home")
	t.Logf("decision latency in eu, links %v one way (client to sluice over loopback gRPC):", s.delay)
	t.Logf("  per-region rule: p50 %v p99 %v", l50.Round(10*time.Microsecond), l99.Round(10*time.Microsecond))
	t.Logf("  global rule:     p50 %v p99 %v (extra p50 %v)", g50.Round(10*time.Microsecond), g99.Round(10*time.Microsecond), (g50 - l50).Round(10*time.Microsecond))
	t.Logf("  home:us rule:    p50 %v p99 %v (extra p50 %v)", h50.Round(10*time.Microsecond), h99.Round(10*time.Microsecond), (h50 - l50).Round(10*time.Microsecond))
	for endpoint, k := range degraded {
		t.Logf("  %s: %d of %d answers degraded", endpoint, k, n)
		if k > n/20 {
			t.Errorf("%s: %d of %d answers degraded", endpoint, k, n)
		}
	}
	// Global decisions never wait on a peer: no extra round trip. Home decisions take one.
	if g50 > l50+s.delay/2 {
		t.Errorf("global p50 %v against per-region %v: a global decision waited on a peer", g50, l50)
	}
	// A home decision takes one round trip at least. On an idle machine it takes less than two
	// (the log line above); on a loaded one the proxies and race-built nodes queue for a CPU
	// (272-362 ms were seen at load 12-30 against a 100-ms round trip), so the upper bound only
	// catches a decision that waited out a deadline (the store's, 10 s here) or a retry.
	if h50 < 2*s.delay || h50 > 2*s.delay+time.Second {
		t.Errorf("home p50 %v, want one round trip (%v) plus the decision", h50, 2*s.delay)
	}
}

// regionsBytes keeps 250 keys of a global rule active, each asked once a second: every region
// walks its own share of the keys at its share of the load. It measures the bytes all links
// carry per second once the keys are known, and the idle links' own, and scales the first to
// 1,000 keys: the sync sends what changed, so its bytes grow with the keys that changed. (250,
// not 1,000: a thousand checks a second is more than race-built nodes on two shared cores
// keep up with.)
func regionsBytes(t *testing.T, s *regionSet) {
	const (
		keys = 250
		run  = 5 * time.Second
	)
	idleFrom, idleBegan := s.bytes(), time.Now()
	time.Sleep(2 * time.Second)
	idle := float64(s.bytes()-idleFrom) / time.Since(idleBegan).Seconds()
	own := map[string]int64{}
	for i, name := range regionNames {
		own[name] = int64(math.Round(keys * regionShares[i]))
	}
	var loads []*regionLoad
	done := make(chan struct{})
	go func() {
		defer close(done)
		loads = s.drive(loadSpec{rate: keys, dur: run, req: func(region string, i int64) *sluicev1.CheckRequest {
			return &sluicev1.CheckRequest{Endpoint: "/keys", User: fmt.Sprintf("%s-%d", region, i%own[region])}
		}})
	}()
	// The first second makes the keys known; the measure is the three after it.
	time.Sleep(time.Second)
	from, began := s.bytes(), time.Now()
	time.Sleep(3 * time.Second)
	used := float64(s.bytes()-from) / time.Since(began).Seconds()
	<-done
	checkNoFailures(t, "bytes", loads)
	offered, _, _ := totals(loads)
	// Every sync sends each peer a message, changed counts or not, and a loaded node's sync
	// loop runs less often than an idle one's: used less idle may even be negative. All of
	// used, scaled, is an upper bound of the sync's cost per key.
	per1000 := used * 1000 / keys
	t.Logf("%d active keys of a global rule (%d requests in %v): %.0f bytes/s on all six links (idle links %.0f bytes/s);"+
		" at most %.0f bytes/s per 1,000 active keys in all, %.0f per region (sent and received)",
		keys, offered, run, used, idle, per1000, per1000/3)
	if offered < keys*int64(run/time.Second)*9/10 {
		t.Errorf("only %d requests offered in %v: the keys were not all active", offered, run)
	}
	// Only that the links carried the sync: how much more than idle links they carry depends
	// on how often two starved cores let every node's sync loop run.
	if used <= 0 {
		t.Errorf("no bytes crossed the links while %d keys were active", keys)
	}
}
