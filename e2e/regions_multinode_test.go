package e2e

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testproxy"
)

// TestRegionsMultiNode runs region us as two sluice serve nodes on one Redis and region eu as
// one node, links delayed 50 ms one way. eu's --regions names us's first node only, as it
// would a load balancer that sends each call to one node: the second node learns eu's counts
// through the region's inbox in Redis. With the load spread over both us nodes, the global
// 1-minute limit must hold as in TestRegions (at most 0.5% over, 1% under), and the second
// node must count eu up with a recent lag.
func TestRegionsMultiNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three sluice processes for about a minute and a half")
	}
	const (
		delay = 50 * time.Millisecond
		limit = 3000
		run   = 26 * time.Second
	)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, regionsPolicy)
	redis := redistest.Start(t)

	usA := &regionNode{name: "us", out: map[string]*testproxy.Proxy{}}
	usB := &regionNode{name: "us", out: map[string]*testproxy.Proxy{}}
	eu := &regionNode{name: "eu", out: map[string]*testproxy.Proxy{}}
	for _, n := range []*regionNode{usA, usB} {
		n.out["eu"] = testproxy.Start(t, "127.0.0.1:1")
	}
	eu.out["us"] = testproxy.Start(t, "127.0.0.1:1")
	startNode := func(n *regionNode, env ...string) {
		peer := "eu"
		if n.name == "eu" {
			peer = "us"
		}
		n.out[peer].Delay(delay)
		n.start(t, path, peer+"="+n.out[peer].Addr, env...)
	}
	startNode(usA, "SLUICE_STORE=redis://"+redis.Addr)
	startNode(usB, "SLUICE_STORE=redis://"+redis.Addr)
	startNode(eu)
	usA.out["eu"].SetUpstream(eu.srv.grpc)
	usB.out["eu"].SetUpstream(eu.srv.grpc)
	eu.out["us"].SetUpstream(usA.srv.grpc) // us's first node only

	// The load's shares follow the nodes' order: us's first node 50%, eu 30%, us's second
	// node 20% (regionShares).
	set := &regionSet{delay: delay, nodes: []*regionNode{usA, eu, usB}}
	labels := []string{"us-a", "eu", "us-b"}
	defer set.stop()
	// us-b's lag behind eu is finite only once it holds a Sync of eu's, which none of its own
	// calls brings: it read it from the inbox.
	waitFor(t, 15*time.Second, "every node sees its peer up, and us-b holds eu's counts", func() bool {
		return regionGauge(usA.srv, "sluice_region_peer_up", "eu") == 1 &&
			regionGauge(usB.srv, "sluice_region_peer_up", "eu") == 1 &&
			regionGauge(eu.srv, "sluice_region_peer_up", "us") == 1 &&
			!math.IsInf(regionGauge(usB.srv, "sluice_region_lag_seconds", "eu"), 1)
	})

	rate := 3 * float64(limit) / 60
	start := waitWindow(time.Minute, run+10*time.Second)
	t.Logf("load starts %v into the window", time.Since(start).Round(time.Millisecond))
	lags := make(chan string, 1)
	go func() {
		time.Sleep(run / 2)
		var out []string
		for i, n := range set.nodes {
			peer := "eu"
			if n.name == "eu" {
				peer = "us"
			}
			out = append(out, fmt.Sprintf("%s→%s %.0fms", peer, labels[i], 1000*regionGauge(n.srv, "sluice_region_lag_seconds", peer)))
		}
		lags <- strings.Join(out, ", ")
	}()
	loads := set.drive(loadSpec{rate: rate, dur: run, window: time.Minute, windowEnd: start.Add(time.Minute),
		req: func(string, int64) *sluicev1.CheckRequest { return &sluicev1.CheckRequest{Endpoint: "/quota"} }})
	t.Logf("lag halfway: %s", <-lags)

	offered, admitted, failed := totals(loads)
	over := max(0, float64(admitted-limit)) / limit * 100
	under := underAdmission(limit, loads)
	t.Logf("us on two nodes (eu syncs to us-a only), links %v one way, sync %v, limit %d a minute, offered 3× split us-a/eu/us-b 50/30/20:",
		delay, regionSync, limit)
	t.Logf("offered %d, in window %d, admitted %d (us-a %d, eu %d, us-b %d): overage %.2f%%, under-admission %.2f%%",
		offered, inWindow(loads), admitted, loads[0].admitted.Load(), loads[1].admitted.Load(), loads[2].admitted.Load(), over, under)
	for i, l := range loads {
		if n := l.later.Load(); n > 0 {
			t.Logf("%d calls to %s were admitted late, in the next window: not counted, nor held against under-admission", n, labels[i])
		}
		if n := l.degraded.Load(); n > 0 {
			t.Logf("%d decisions in %s were degraded (its store failed; fail open), counted as admitted", n, labels[i])
		}
		if n := l.failed.Load(); n > 0 {
			t.Errorf("%d calls failed in %s, first: %v", n, labels[i], l.firstErr.Load())
		}
	}
	if failed == 0 {
		if over > 0.5 {
			t.Errorf("overage %.2f%%, want at most 0.5%%", over)
		}
		if in := inWindow(loads); in < limit*6/5 {
			t.Logf("only %d decisions in the window (the load fell behind): under-admission not judged", in)
		} else if under > 1 {
			t.Errorf("under-admission %.2f%%, want at most 1%%", under)
		}
	}
	if up := regionGauge(usB.srv, "sluice_region_peer_up", "eu"); up != 1 {
		t.Errorf("us-b: sluice_region_peer_up{region=\"eu\"} = %v, want 1", up)
	}
	if lag := regionGauge(usB.srv, "sluice_region_lag_seconds", "eu"); !(lag < 5) {
		t.Errorf("us-b: sluice_region_lag_seconds{region=\"eu\"} = %v, want a recent Sync (under 5 s)", lag)
	}
}
