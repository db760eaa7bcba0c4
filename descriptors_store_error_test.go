package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/breaker"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// storeErrorDomains say on_store_error on a domain and on descriptors, inherited down the
// tree; "plain" says nothing and fails open, as Envoy's reference service does.
const storeErrorDomains = `
domain: edge
on_store_error: closed
descriptors:
  - key: path
    value: /open
    on_store_error: open
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /closed
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    on_store_error: local
    descriptors:
      - key: quota
        rate_limit: {unit: hour, requests_per_unit: 4}
`

const plainDomain = `
domain: plain
descriptors:
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestDescriptorsStoreDown stops a real Redis under a Limiter guarded by the circuit breaker,
// as serve wires them: each Envoy-format limit decides by its on_store_error, the decision is
// marked degraded, and normal decisions come back with Redis.
func TestDescriptorsStoreDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs, err := redis.New(context.Background(), "redis://"+srv.Addr, redis.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	st := breaker.New(rs, breaker.Options{Timeout: 200 * time.Millisecond, OpenFor: 100 * time.Millisecond})
	snap := testutil.Snapshot(t, "rules: []\n").WithEnvoy(mustEnvoy(t), "v1")
	lim, err := sluice.New(st, snap,
		sluice.WithFallback(memory.New(memory.WithSweepInterval(0))),
		sluice.WithLocalShare(2))
	if err != nil {
		t.Fatal(err)
	} // a fleet of 2: the local limit's 4 become 2 here
	defer lim.Close()

	check := func(domain string, descs ...sluice.Descriptor) sluice.DescriptorDecision {
		t.Helper()
		var d sluice.DescriptorDecision
		if err := lim.CheckDescriptors(context.Background(), &sluice.DescriptorRequest{Domain: domain, Descriptors: descs}, &d); err != nil {
			t.Fatalf("%s %v: %v", domain, descs, err)
		}
		return d
	}
	path := func(p string) sluice.Descriptor {
		return sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "path", Value: p}}}
	}
	quota := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "tenant", Value: "acme"}, {Key: "quota", Value: "q"}}}
	override := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "path", Value: "/closed"}},
		Limit: &sluice.DescriptorLimit{RequestsPerUnit: 100, Unit: "hour"}}

	if d := check("edge", path("/open")); !d.OK || d.Degraded {
		t.Fatalf("with Redis up: %+v", d)
	}
	srv.Stop()
	cases := []struct {
		name   string
		domain string
		desc   sluice.Descriptor
		ok     bool
	}{
		{"descriptor open", "edge", path("/open"), true},
		{"domain closed", "edge", path("/closed"), false},
		{"per-request override under a closed node", "edge", override, false},
		{"domain without on_store_error fails open", "plain", path("/x"), true},
	}
	for _, c := range cases {
		d := check(c.domain, c.desc)
		if d.OK != c.ok || !d.Degraded || d.Statuses[0].OK != c.ok || !d.Statuses[0].HasLimit {
			t.Errorf("%s: ok=%v degraded=%v status %+v, want ok=%v and degraded", c.name, d.OK, d.Degraded, d.Statuses[0], c.ok)
		}
	}
	// local, inherited from the tenant node: this node's share of 4 is 2.
	for i := range 3 {
		if d := check("edge", quota); d.OK != (i < 2) || !d.Degraded {
			t.Errorf("local request %d: ok=%v degraded=%v", i, d.OK, d.Degraded)
		}
	}
	// A request mixing modes: the closed descriptor denies it, and the local one's denied
	// request consumed nothing there.
	if d := check("edge", path("/open"), path("/closed")); d.OK || !d.Statuses[0].OK || d.Statuses[1].OK {
		t.Errorf("open and closed together: %+v", d)
	}

	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := check("edge", path("/closed"))
		if !d.Degraded {
			if !d.OK {
				t.Errorf("after Redis came back: %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("decisions still degraded 10 s after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mustEnvoy(t *testing.T) *envoyconf.Config {
	t.Helper()
	cfg, err := envoyconf.Load(map[string][]byte{"edge.yaml": []byte(storeErrorDomains), "plain.yaml": []byte(plainDomain)}, false)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
