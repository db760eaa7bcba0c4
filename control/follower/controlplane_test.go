package follower_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/follower"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/stallwatch"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/transport/httpapi"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// basePolicy limits nothing that the tests send: every denial comes from the control store.
const basePolicy = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: token_bucket, limit: 1000000, period: 1s}
`

func files(t testing.TB, yml string) *policy.Files {
	t.Helper()
	f, err := policy.ParseFiles(map[string][]byte{"policy.yaml": []byte(yml)})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// node is one Sluice node: its own Limiter over its own memory store, following a control
// store through a Runtime.
type node struct {
	store control.Store
	lim   *sluice.Limiter
	rt    *follower.Runtime
	m     *metrics.Metrics
	reg   *prometheus.Registry
}

func startNode(t testing.TB, st control.Store, id string, f *policy.Files, opts ...func(*follower.Options)) *node {
	t.Helper()
	lim, err := sluice.New(memory.New(memory.WithSweepInterval(0)), f.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	o := follower.Options{Store: st, Limiter: lim, Files: f, NodeID: id, Addr: "127.0.0.1:0", Metrics: m}
	for _, opt := range opts {
		opt(&o)
	}
	rt, err := follower.New(o)
	if err != nil {
		t.Fatal(err)
	}
	rt.Start(t.Context())
	t.Cleanup(rt.Close)
	return &node{store: st, lim: lim, rt: rt, m: m, reg: reg}
}

func openPG(t testing.TB, url string) control.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), url, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openSQLite(t testing.TB, path string, opts control.Options) control.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// allowed checks one request on n.
func (n *node) allowed(t testing.TB, r sluice.Request) bool {
	t.Helper()
	var d sluice.Decision
	if err := n.lim.Check(context.Background(), &r, &d); err != nil {
		t.Fatalf("Check(%+v): %v", r, err)
	}
	return d.Allowed
}

// waitDenied checks r on n until it is denied, and returns how long that took from start.
// It gives up after limit.
func (n *node) waitDenied(t testing.TB, r sluice.Request, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	for {
		if !n.allowed(t, r) {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%+v still allowed after %v (policy %s)", r, limit, n.lim.Policy().Version)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

var alice = control.Change{Actor: "alice"}

func ban(t testing.TB, s control.Store, tenant string) control.Override {
	t.Helper()
	o, err := s.CreateOverride(context.Background(), alice, control.Override{
		Tenant: tenant, Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour),
		Source: control.SourceAPI, Reason: "test ban",
	})
	if err != nil {
		t.Fatalf("ban %s: %v", tenant, err)
	}
	return o
}

// TestTwoNodesOnePostgres: a ban made through node A's store is enforced by node B within
// 1 s; a rule made through B is enforced by A; both heartbeat the same control version.
func TestTwoNodesOnePostgres(t *testing.T) {
	url := pgtest.DB(t)
	f := files(t, basePolicy)
	a := startNode(t, openPG(t, url), "node-a", f)
	b := startNode(t, openPG(t, url), "node-b", f)
	stalls := stallwatch.Start(t)

	if !b.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) {
		t.Fatal("acme denied before the ban")
	}
	start := time.Now()
	ban(t, a.store, "acme")
	took := b.waitDenied(t, sluice.Request{Tenant: "acme", User: "u"}, start, 10*time.Second)
	t.Logf("ban on A enforced by B after %v", took)
	if own := took - stalls.During(start, start.Add(took)); own > time.Second {
		t.Errorf("ban took %v to reach B (stalls discounted: %v), want within 1 s", took, own)
	}

	start = time.Now()
	if _, err := b.store.CreateRule(t.Context(), control.Change{Actor: "bob"}, "beta-per-minute",
		json.RawMessage(`{"match": {"tenant": "beta"}, "key": ["tenant"], "algorithm": "fixed_window", "limit": 1, "period": "1m"}`)); err != nil {
		t.Fatal(err)
	}
	// The rule allows one request per minute: the first allowed request may come before the
	// rule reached A, so wait until A has it, then spend it.
	for a.lim.Policy().Rule("beta-per-minute") == nil {
		if time.Since(start) > 10*time.Second {
			t.Fatal("rule made on B never reached A")
		}
		time.Sleep(200 * time.Microsecond)
	}
	took = time.Since(start)
	t.Logf("rule made on B enforced by A after %v", took)
	if own := took - stalls.During(start, start.Add(took)); own > time.Second {
		t.Errorf("rule took %v to reach A (stalls discounted: %v), want within 1 s", took, own)
	}
	a.allowed(t, sluice.Request{Tenant: "beta"})
	if a.allowed(t, sluice.Request{Tenant: "beta"}) {
		t.Error("A allows beta past the rule made on B")
	}

	// Both nodes report the version that holds both changes, within a heartbeat of the swap.
	v, err := a.store.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		nodes, err := a.store.Nodes(t.Context(), time.Now().Add(-follower.LiveNodeWindow))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range nodes {
			got = append(got, fmt.Sprintf("%s@%d", n.ID, n.PolicyVersion))
		}
		if want := []string{fmt.Sprintf("node-a@%d", v), fmt.Sprintf("node-b@%d", v)}; slices.Equal(got, want) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("nodes %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a.lim.Policy().Version != b.lim.Policy().Version || a.rt.PolicyVersion(v) != a.lim.Policy().Version {
		t.Errorf("versions: A %s, B %s, PolicyVersion(%d) %s", a.lim.Policy().Version, b.lim.Policy().Version, v, a.rt.PolicyVersion(v))
	}
}

// TestPropagationLatency measures how long a ban made through node A takes to be enforced by
// node B, over 100 bans, from the call that makes it to B's first denial.
func TestPropagationLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("100 round trips through PostgreSQL")
	}
	url := pgtest.DB(t)
	f := files(t, basePolicy)
	a := startNode(t, openPG(t, url), "node-a", f)
	b := startNode(t, openPG(t, url), "node-b", f)
	times, own := banLatencies(t, a, b, 100, 10*time.Second)
	t.Logf("ban on A enforced by B over %d bans: p50 %v, p90 %v, max %v (stalls of this process discounted: p50 %v, max %v)",
		len(times), times[len(times)/2], times[len(times)*9/10], times[len(times)-1], own[len(own)/2], own[len(own)-1])
	if own[len(own)-1] > time.Second {
		t.Errorf("slowest ban took %v (stalls discounted), want within 1 s", own[len(own)-1])
	}
}

// banLatencies makes n bans through node a and times each from the call that makes it to node
// b's first denial: sorted, as measured and with the stalls of this test process discounted.
// A ban not enforced within limit fails the test.
func banLatencies(t *testing.T, a, b *node, n int, limit time.Duration) (times, own []time.Duration) {
	t.Helper()
	stalls := stallwatch.Start(t)
	for i := range n {
		tenant := fmt.Sprint("tenant-", i)
		start := time.Now()
		ban(t, a.store, tenant)
		took := b.waitDenied(t, sluice.Request{Tenant: tenant, User: "u"}, start, limit)
		times = append(times, took)
		own = append(own, took-stalls.During(start, start.Add(took)))
	}
	slices.Sort(times)
	slices.Sort(own)
	return times, own
}

// TestPropagationLatencyLargeStore is TestPropagationLatency with 10,000 overrides and 10,000
// identity assignments in the store: every change makes each node read and compile all of it.
func TestPropagationLatencyLargeStore(t *testing.T) {
	if testing.Short() {
		t.Skip("fills PostgreSQL with 20,000 entries")
	}
	url := pgtest.DB(t)
	fill := openPG(t, url)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 10000; i += 8 {
				if _, err := fill.CreateOverride(context.Background(), alice, control.Override{
					Tenant: fmt.Sprint("filler-", i), Type: control.OverrideMultiplier, Value: 2,
					ExpiresAt: time.Now().Add(time.Hour), Source: control.SourceAPI,
				}); err != nil {
					errs <- err
					return
				}
				if _, _, err := fill.PutIdentity(context.Background(), alice, control.Identity{
					Kind: control.IdentityAPIKey, Value: fmt.Sprint("key-", i), Tenant: fmt.Sprint("filler-", i), Tier: "gold",
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	f := files(t, basePolicy)
	a := startNode(t, openPG(t, url), "node-a", f)
	b := startNode(t, openPG(t, url), "node-b", f)
	if got := b.lim.Policy().Identities(); got != 10000 {
		t.Fatalf("node B holds %d identity assignments, want 10000", got)
	}
	times, own := banLatencies(t, a, b, 20, 60*time.Second)
	t.Logf("with 10,000 overrides and 10,000 identities: ban on A enforced by B over %d bans: p50 %v, max %v (stalls discounted: p50 %v, max %v)",
		len(times), times[len(times)/2], times[len(times)-1], own[len(own)/2], own[len(own)-1])
	// Each change reads and recompiles all 20,000 entries. Race-built on a CI machine whose two
	// cores also run other packages' tests and busy loops, that read and compile stretch many
	// times over, and a busy machine slows this process without stalling it outright, so
	// stallwatch discounts little: the bounds leave room for that (docs/testing.md) and still
	// fail a ban that is never enforced or a read and compile that grew much slower with the
	// store. The unloaded figures are in docs/measurements.md; the push itself is held to a
	// second by TestPropagationLatency.
	if own[len(own)/2] > 20*time.Second {
		t.Errorf("bans took p50 %v (stalls discounted), want within 20 s", own[len(own)/2])
	}
}

// gauge reads sluice_control_store_up.
func (n *node) storeUp(t testing.TB) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_control_store_up" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no sluice_control_store_up")
	return -1
}

// readyz answers GET /readyz of an HTTP API over n, with the control store as its optional
// check, as serve sets it up.
func (n *node) readyz(t testing.TB) (int, map[string]string) {
	t.Helper()
	api := httpapi.New(n.lim, n.m, httpapi.Options{Ready: []httpapi.ReadyCheck{
		{Name: "store", Check: func(context.Context) error { return nil }},
		{Name: "control_store", Check: n.rt.Health, Optional: true},
	}})
	w := httptest.NewRecorder()
	api.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var body map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("/readyz %q: %v", w.Body, err)
	}
	return w.Code, body
}

// waitFor polls cond every 10 ms until it holds, failing after limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPostgresDownUnderTraffic stops PostgreSQL while a node decides requests: decisions go on
// unchanged and without errors, the node reports the control store down (metric 0, /readyz
// 200 naming it down); once PostgreSQL is back, the node reports it up and follows changes.
func TestPostgresDownUnderTraffic(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	n := startNode(t, openPG(t, url), "node-a", files(t, basePolicy))
	ban(t, n.store, "acme")
	waitFor(t, 5*time.Second, "ban enforced", func() bool { return !n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) })
	if n.storeUp(t) != 1 {
		t.Fatal("sluice_control_store_up is not 1 with the store up")
	}
	if code, body := n.readyz(t); code != 200 || body["control_store"] != "up" {
		t.Fatalf("/readyz with the store up: %d %v", code, body)
	}

	// Traffic: acme is banned, zeta is not; every decision must stay so, without an error.
	var checks, wrong atomic.Int64
	var firstErr atomic.Pointer[error]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var d sluice.Decision
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, c := range []struct {
				req   sluice.Request
				allow bool
			}{{sluice.Request{Tenant: "acme", User: "u"}, false}, {sluice.Request{Tenant: "zeta", User: "u"}, true}} {
				if err := n.lim.Check(context.Background(), &c.req, &d); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				} else if d.Allowed != c.allow {
					wrong.Add(1)
				}
				checks.Add(1)
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()

	c.Stop()
	waitFor(t, 10*time.Second, "control store reported down", func() bool { return !n.rt.Up() })
	before := checks.Load()
	time.Sleep(300 * time.Millisecond) // traffic while down
	if checks.Load() == before {
		t.Error("no decisions while the control store was down")
	}
	if got := n.storeUp(t); got != 0 {
		t.Errorf("sluice_control_store_up = %v with the store down", got)
	}
	code, body := n.readyz(t)
	if code != 200 || body["status"] != "ready" || body["control_store"] != "down" || body["store"] != "up" {
		t.Errorf("/readyz with the control store down: %d %v", code, body)
	}
	t.Logf("/readyz while down: %v", body)

	c.Restart(t)
	waitFor(t, 10*time.Second, "control store reported up", n.rt.Up)
	if got := n.storeUp(t); got != 1 {
		t.Errorf("sluice_control_store_up = %v with the store back", got)
	}
	ban(t, n.store, "beta")
	n.waitDenied(t, sluice.Request{Tenant: "beta", User: "u"}, time.Now(), 10*time.Second)

	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close
	if e := firstErr.Load(); e != nil {
		t.Errorf("a decision failed: %v", *e)
	}
	if wrong.Load() > 0 {
		t.Errorf("%d of %d decisions changed", wrong.Load(), checks.Load())
	}
	t.Logf("%d decisions, none changed, none failed", checks.Load())
}

// TestStartWithPostgresDown: a node whose control store is down at start serves on its files
// alone, and takes the store's state once it answers.
func TestStartWithPostgresDown(t *testing.T) {
	c := pgtest.Start(t)
	url := c.CreateDB(t)
	ban(t, openPG(t, url), "acme")
	c.Stop()

	lazy, err := postgres.OpenLazy(url, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lazy.Close() })
	f := files(t, basePolicy)
	n := startNode(t, lazy, "node-a", f)
	if n.rt.Up() || n.lim.Policy().Version != f.Version+".0" || !n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) {
		t.Fatalf("with the store down at start: up %v, policy %s", n.rt.Up(), n.lim.Policy().Version)
	}
	if err := n.rt.Health(t.Context()); err == nil {
		t.Error("Health is nil with the store never reached")
	}

	c.Restart(t)
	n.waitDenied(t, sluice.Request{Tenant: "acme", User: "u"}, time.Now(), 10*time.Second)
	if !n.rt.Up() || n.lim.Policy().Version != f.Version+".1" {
		t.Errorf("after the store came back: up %v, policy %s", n.rt.Up(), n.lim.Policy().Version)
	}
}

// TestSQLiteAppliesAtOnce: on the embedded store a change reaches the node's runtime in
// process; Sync makes it enforced before the caller goes on.
func TestSQLiteAppliesAtOnce(t *testing.T) {
	st := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})
	n := startNode(t, st, "node-a", files(t, basePolicy))

	o := ban(t, st, "acme")
	if err := n.rt.Sync(t.Context(), o.Version); err != nil {
		t.Fatal(err)
	}
	if n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) {
		t.Error("acme allowed after Sync of its ban")
	}
	if err := n.rt.Sync(t.Context(), o.Version+100); err == nil {
		t.Error("Sync to a version the store does not have succeeded")
	}

	// Without Sync, the store's in-process notification brings it.
	start := time.Now()
	ban(t, st, "beta")
	took := n.waitDenied(t, sluice.Request{Tenant: "beta", User: "u"}, start, 5*time.Second)
	t.Logf("SQLite: ban enforced %v after the call that made it", took)
}

// TestFileReloadCompilesWithControlAndIsAudited: a reload of the policy files is compiled with
// the control store's state, and audited once with actor file:PATH and the versions before
// and after; a node starting on files already recorded adds no event.
func TestFileReloadCompilesWithControlAndIsAudited(t *testing.T) {
	const path = "/etc/sluice/policy.yaml"
	st := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})
	ban(t, st, "acme")
	v1 := files(t, basePolicy)
	withPath := func(o *follower.Options) { o.FilesPath = path }
	n := startNode(t, st, "node-a", v1, withPath)
	events := func() []control.AuditEvent {
		evs, err := st.Audit(t.Context(), control.AuditFilter{Kind: control.KindPolicyFiles})
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	waitFor(t, 5*time.Second, "the start's audit event", func() bool { return len(events()) == 1 })

	v2 := files(t, basePolicy+`
  - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 2, period: 1m}
`)
	if err := n.rt.SetFiles(v2, "SIGHUP"); err != nil {
		t.Fatal(err)
	}
	v, _ := st.Version(t.Context())
	if got, want := n.lim.Policy().Version, policy.Version(v2.Version, v); got != want {
		t.Errorf("policy %s after the reload, want %s", got, want)
	}
	if n.allowed(t, sluice.Request{Tenant: "acme", User: "u"}) {
		t.Error("the control store's ban was lost by the files reload")
	}
	n.allowed(t, sluice.Request{Tenant: "zeta"})
	n.allowed(t, sluice.Request{Tenant: "zeta"})
	if n.allowed(t, sluice.Request{Tenant: "zeta"}) {
		t.Error("the reloaded file's rule does not apply")
	}

	waitFor(t, 5*time.Second, "the reload's audit event", func() bool { return len(events()) == 2 })
	e := events()[0]
	var before, after struct{ Version string }
	json.Unmarshal(e.Before, &before)
	json.Unmarshal(e.After, &after)
	if e.Actor != "file:"+path || e.Action != control.ActionUpdate || e.Target != path ||
		before.Version != v1.Version || after.Version != v2.Version || e.Reason == "" {
		t.Errorf("reload event %+v (before %s, after %s), want file:%s update %s -> %s", e, e.Before, e.After, path, v1.Version, v2.Version)
	}

	// A second node on the same files: nothing new to record.
	n2 := startNode(t, st, "node-b", v2, withPath)
	waitFor(t, 5*time.Second, "node-b up", n2.rt.Up)
	time.Sleep(200 * time.Millisecond)
	if got := len(events()); got != 2 {
		t.Errorf("%d policy_files events after a node started on recorded files, want 2", got)
	}
}

// TestExemptionStopsAtExpiry: an exemption with an expiry stops applying when it expires,
// without waiting for the store to delete it.
func TestExemptionStopsAtExpiry(t *testing.T) {
	st := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{})
	// No maintenance during the test: the expiry must come from the node's own recompile.
	n := startNode(t, st, "node-a", files(t, `
rules:
  - {name: one, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
`), func(o *follower.Options) { o.MaintenanceInterval = time.Hour })
	expires := time.Now().Add(300 * time.Millisecond)
	e, err := st.CreateExemption(t.Context(), alice, control.Exemption{User: "partner", ExpiresAt: &expires, Reason: "trial"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.rt.Sync(t.Context(), e.Version); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if !n.allowed(t, sluice.Request{User: "partner"}) && time.Now().Before(*e.ExpiresAt) {
			t.Fatal("the exempt partner is denied before the expiry")
		}
	}
	var d sluice.Decision
	for {
		r := sluice.Request{User: "partner"}
		if err := n.lim.Check(t.Context(), &r, &d); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if !d.Exempt {
			if at.Before(*e.ExpiresAt) {
				t.Fatalf("exemption ended at %v, before its expiry %v", at, *e.ExpiresAt)
			}
			t.Logf("exemption ended %v after its expiry", at.Sub(*e.ExpiresAt))
			break
		}
		if at.After(e.ExpiresAt.Add(5 * time.Second)) {
			t.Fatal("the exemption still applies 5 s after its expiry")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := st.GetExemption(t.Context(), e.ID); err != nil {
		t.Errorf("the exemption was deleted (%v): the recompile, not the store, must end it", err)
	}
}

// fakeClock is a settable clock for the store and the runtime.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestMaintenance: the node expires overrides past their expiry (auditing each) and prunes
// audit events and nodes older than their retention.
func TestMaintenance(t *testing.T) {
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	st := openSQLite(t, filepath.Join(t.TempDir(), "control.db"), control.Options{Now: clock.Now})
	o, err := st.CreateOverride(t.Context(), alice, control.Override{
		Tenant: "acme", Type: control.OverrideBan, ExpiresAt: clock.Now().Add(time.Minute), Source: control.SourceAPI,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Heartbeat(t.Context(), control.Node{ID: "gone"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)

	startNode(t, st, "node-a", files(t, basePolicy), func(o *follower.Options) {
		o.Now = clock.Now
		o.MaintenanceInterval = 20 * time.Millisecond
		o.AuditRetention = time.Hour
		o.NodeRetention = time.Hour
	})
	waitFor(t, 5*time.Second, "override expired", func() bool {
		_, err := st.GetOverride(t.Context(), o.ID)
		return errors.Is(err, control.ErrNotFound)
	})
	waitFor(t, 5*time.Second, "old audit and nodes pruned", func() bool {
		evs, err := st.Audit(t.Context(), control.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := st.Nodes(t.Context(), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs) == 1 && evs[0].Action == control.ActionExpire && len(nodes) == 1 && nodes[0].ID == "node-a"
	})
}
