package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
)

// abusePolicy has one limit per tenant, per node (each node has its own memory store): 20 a
// minute, 2 under the detector's penalty (multiplier 0.1).
const abusePolicy = `
rules:
  - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 20, period: 1m}
`

// abuseInterval is --abuse-interval in these tests; the window is a minute, a penalty 4 s.
const abuseInterval = time.Second

// abuseFleet is two nodes on one PostgreSQL with the abuse detector on short settings, and a
// control store of the test's own on the same database.
type abuseFleet struct {
	nodes map[string]*server // by node id
	store control.Store
}

func startAbuseFleet(t *testing.T) *abuseFleet {
	t.Helper()
	pg := pgtest.Start(t)
	url := pg.CreateDB(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	writeFile(t, cfg, abusePolicy)
	f := &abuseFleet{nodes: map[string]*server{}}
	for _, id := range []string{"node-a", "node-b"} {
		f.nodes[id] = start(t, cfg, t.TempDir(), "SLUICE_CONTROL="+url, "SLUICE_ADMIN_TOKEN="+e2eAdminToken, "SLUICE_NODE_ID="+id,
			"ABUSE_INTERVAL="+abuseInterval.String(), "ABUSE_WINDOW=1m", "ABUSE_MIN_REQUESTS=20", "ABUSE_PENALTY=4s")
	}
	st, err := postgres.Open(t.Context(), url, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f.store = st
	return f
}

// holder returns the node that holds the detector's lease, waiting for one to take it.
func (f *abuseFleet) holder(t *testing.T) string {
	t.Helper()
	var id string
	waitFor(t, 10*time.Second, "a node takes the abuse-detector lease", func() bool {
		h, until, err := f.store.Lease(context.Background(), "abuse-detector")
		id = h
		return err == nil && until.After(time.Now()) && f.nodes[h] != nil
	})
	return id
}

// limitOf is the per-tenant limit s enforces on tenant now (a quota look: no decision).
func (s *server) limitOf(tenant string) int64 {
	s.t.Helper()
	_, _, m := s.post("/v1/quota", fmt.Sprintf(`{"tenant":%q}`, tenant))
	results, _ := m["results"].([]any)
	for _, r := range results {
		if r, _ := r.(map[string]any); r["rule"] == "per-tenant" {
			l, _ := r["limit"].(float64)
			return int64(l)
		}
	}
	s.t.Fatalf("quota of %s: no per-tenant result in %v", tenant, m)
	return 0
}

// metric returns the value of one series on s's /metrics, e.g.
// `sluice_abuse_runs_total{status="ok"}`; 0 when absent.
func (s *server) metric(series string) float64 {
	s.t.Helper()
	for _, line := range strings.Split(s.get("/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				s.t.Fatalf("metric %s: %q", series, line)
			}
			return f
		}
	}
	return 0
}

// traffic makes a tenant's counts reach the control store: fed directly, or sent as real
// requests through the nodes (which needs their decision-event recorder).
type traffic struct {
	// noisy makes tenant 90% throttled, calm 0%, each with at least 20 requests, on nodes.
	noisy, calm func(t *testing.T, f *abuseFleet, tenant string, nodes ...*server)
	// within bounds how long counts take to reach the store, beside the detector's interval.
	within time.Duration
	// percent is the noisy tenant's throttled share as the penalty's reason gives it; 0 when
	// it depends on timing (a fixed window that turns during the burst admits more).
	percent int
}

// fed writes the counts to the control store, as the nodes' event writers would: the
// detector's part of the job, alone.
var fed = traffic{
	noisy: func(t *testing.T, f *abuseFleet, tenant string, _ ...*server) {
		addUsage(t, f.store, tenant, 20, 180)
	},
	calm: func(t *testing.T, f *abuseFleet, tenant string, _ ...*server) {
		addUsage(t, f.store, tenant, 30, 0)
	},
	percent: 90,
}

func addUsage(t *testing.T, st control.Store, tenant string, allowed, denied int64) {
	t.Helper()
	if err := st.AddCounts(context.Background(), []control.UsageCount{
		{Minute: time.Now(), Rule: "per-tenant", Tenant: tenant, Allowed: allowed, Denied: denied},
	}, nil); err != nil {
		t.Fatal(err)
	}
}

// real sends requests: per node, 200 from a noisy tenant (its limit is 20: 180 denied) or 15
// from a calm one.
var real = traffic{
	noisy: func(t *testing.T, _ *abuseFleet, tenant string, nodes ...*server) {
		for _, s := range nodes {
			for range 200 {
				s.checkStatus(fmt.Sprintf(`{"tenant":%q}`, tenant))
			}
		}
	},
	calm: func(t *testing.T, _ *abuseFleet, tenant string, nodes ...*server) {
		for _, s := range nodes {
			for range 15 {
				if code := s.checkStatus(fmt.Sprintf(`{"tenant":%q}`, tenant)); code != 200 {
					t.Fatalf("calm tenant refused: %d", code)
				}
			}
		}
	},
	within: 10 * time.Second, // the recorder flushes every few seconds
}

// TestAbuseDetectorOnTwoNodes: counts in the control store as the nodes' recorders write them;
// the detector on two nodes of one PostgreSQL, through the real binary.
func TestAbuseDetectorOnTwoNodes(t *testing.T) {
	abuseScenario(t, startAbuseFleet(t), fed)
}

// TestAbuseDetectorRealTraffic is the same, driven by real requests: it needs the nodes to
// record their decisions (telemetry/usage, sluice_events_*), and skips until they do.
func TestAbuseDetectorRealTraffic(t *testing.T) {
	f := startAbuseFleet(t)
	for _, s := range f.nodes {
		if !strings.Contains(s.get("/metrics"), "sluice_events_") {
			t.Skip("needs the decision-event recorder (telemetry/usage, sluice_events_* metrics) to count real traffic")
		}
	}
	abuseScenario(t, f, real)
}

func abuseScenario(t *testing.T, f *abuseFleet, tr traffic) {
	holderID := f.holder(t)
	var holder, other *server
	for id, s := range f.nodes {
		if id == holderID {
			holder = s
		} else {
			other = s
		}
	}
	nodes := []*server{holder, other}

	// A noisy tenant is penalized within an interval of its counts reaching the store, and
	// every node enforces the penalty; a calm one and a quiet one (below 20 requests) are not.
	tr.calm(t, f, "calm", nodes...)
	addUsage(t, f.store, "quiet", 0, 19)
	tr.noisy(t, f, "noisy", nodes...)
	counted := time.Now()
	took := waitFor(t, tr.within+3*abuseInterval, "the noisy tenant's penalty enforced on both nodes", func() bool {
		return holder.limitOf("noisy") == 2 && other.limitOf("noisy") == 2
	})
	t.Logf("noisy tenant penalized on both nodes %v after its counts were in (interval %v)", took, abuseInterval)
	for _, s := range nodes {
		for _, tenant := range []string{"calm", "quiet"} {
			if l := s.limitOf(tenant); l != 20 {
				t.Errorf("%s's limit on %s = %d, want 20 (not penalized)", tenant, s.http, l)
			}
		}
	}

	code, m := other.admin("GET", "/admin/v1/overrides?source=automatic", "")
	list, _ := m["overrides"].([]any)
	if code != 200 || len(list) != 1 {
		t.Fatalf("automatic overrides: %d %v; want the noisy tenant's alone", code, m)
	}
	o := list[0].(map[string]any)
	for k, want := range map[string]any{
		"tenant": "noisy", "type": "multiplier", "value": 0.1, "source": "automatic", "created_by": "abuse-detector",
	} {
		if o[k] != want {
			t.Errorf("override %s = %v, want %v (%v)", k, o[k], want, o)
		}
	}
	reason, _ := o["reason"].(string)
	var percent int
	if _, err := fmt.Sscanf(reason, "automatic abuse detection: %d%% throttled over 1m", &percent); err != nil ||
		percent <= 80 || tr.percent != 0 && percent != tr.percent || !strings.HasSuffix(reason, " over 1m") {
		t.Errorf("override reason %q; want \"automatic abuse detection: N%% throttled over 1m\" with N above 80 (%d)", reason, tr.percent)
	}
	created, _ := time.Parse(time.RFC3339Nano, o["created_at"].(string))
	expires, _ := time.Parse(time.RFC3339Nano, o["expires_at"].(string))
	// expires_at is the detector's clock plus the penalty, created_at the store's a moment later.
	if d := expires.Sub(created); d < 4*time.Second-100*time.Millisecond || d > 4*time.Second {
		t.Errorf("the penalty lasts %v, want 4s (--abuse-penalty)", d)
	}
	if created.Before(counted.Add(-time.Second)) {
		t.Errorf("override created at %v, before the counts (%v)", created, counted)
	}
	code, m = holder.admin("GET", "/admin/v1/audit?actor=abuse-detector", "")
	events, _ := m["events"].([]any)
	if code != 200 || len(events) != 1 {
		t.Fatalf("audit by abuse-detector: %d %v", code, m)
	}
	if e := events[0].(map[string]any); e["kind"] != "override" || e["action"] != "create" || e["reason"] != o["reason"] {
		t.Errorf("audit event %v", e)
	}

	// The penalty expires on time on both nodes.
	waitFor(t, time.Until(expires)+3*time.Second, "the penalty lifted on both nodes", func() bool {
		return holder.limitOf("noisy") == 20 && other.limitOf("noisy") == 20
	})
	if late := time.Since(expires); late < -100*time.Millisecond {
		t.Errorf("the penalty was lifted %v before it expires", -late)
	} else {
		t.Logf("penalty lifted on both nodes %v after its expiry", late)
	}

	// Only the lease holder runs the detector. The lease lasts an interval (1 s here): on a
	// loaded machine the holder may renew it late and the other take it, which is the lease
	// working; then the holder must have seen it held by the other, and the fleet still made
	// one penalty.
	if n := holder.metric(`sluice_abuse_runs_total{status="ok"}`); n < 1 {
		t.Errorf("the lease holder ran %v times", n)
	}
	if n := other.metric(`sluice_abuse_runs_total{status="ok"}`); n != 0 {
		if lost := holder.metric(`sluice_abuse_runs_total{status="not_leader"}`); lost < 1 {
			t.Errorf("the other node ran the detector %v times while the holder never lost the lease", n)
		} else {
			t.Logf("the lease moved on the loaded machine: the other node ran %v times, the holder saw it held %v times", n, lost)
		}
	}
	if n := other.metric(`sluice_abuse_runs_total{status="not_leader"}`); n < 1 {
		t.Errorf("the other node counted %v not_leader intervals", n)
	}
	fleet := func(name string) float64 { return holder.metric(name) + other.metric(name) }
	if n := fleet(`sluice_abuse_flags_total{severity="high"}`); n != 1 {
		t.Errorf("high flags over the fleet: %v, want 1", n)
	}
	if n := fleet(`sluice_overrides_applied_total{source="automatic",type="multiplier"}`); n != 1 {
		t.Errorf("automatic overrides applied over the fleet: %v, want 1", n)
	}

	// Killing the holder hands the job to the other within two intervals.
	holder.cmd.Process.Kill()
	<-holder.exited
	killed := time.Now()
	took = waitFor(t, 10*time.Second, "the other node takes the lease", func() bool {
		h, _, err := f.store.Lease(context.Background(), "abuse-detector")
		return err == nil && f.nodes[h] == other
	})
	t.Logf("the other node took the abuse-detector lease %v after the holder was killed (interval %v)", took, abuseInterval)
	if took > 2*abuseInterval {
		t.Errorf("takeover took %v, more than two intervals (%v)", took, 2*abuseInterval)
	}
	tr.noisy(t, f, "noisy2", other)
	waitFor(t, tr.within+3*abuseInterval, "the survivor penalizes a noisy tenant", func() bool {
		return other.limitOf("noisy2") == 2
	})
	t.Logf("the survivor penalized a new noisy tenant %v after the kill", time.Since(killed))
}

// TestServeRejectsBadAbuseSettings: a bad --abuse-* flag or ABUSE_* variable stops serve with
// an error naming it, before it listens.
func TestServeRejectsBadAbuseSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flag, env, want string
	}{
		{flag: "--abuse-threshold=1.5", want: "--abuse-threshold"},
		{flag: "--abuse-interval=0", want: "--abuse-interval"},
		{flag: "--abuse-window=10s", want: "--abuse-window"},
		{flag: "--abuse-min-requests=0", want: "--abuse-min-requests"},
		{flag: "--abuse-multiplier=2", want: "--abuse-multiplier"},
		{flag: "--abuse-penalty=forever", want: "--abuse-penalty"},
		{env: "ABUSE_THRESHOLD=lots", want: "ABUSE_THRESHOLD"},
		{env: "ABUSE_DETECTION=perhaps", want: "ABUSE_DETECTION"},
		{flag: "--abuse-max-penalties=0", want: "--abuse-max-penalties"},
		{env: "SLUICE_ABUSE_MAX_PENALTIES=many", want: "SLUICE_ABUSE_MAX_PENALTIES"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		args := []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir()}
		if c.flag != "" {
			args = append(args, c.flag)
		}
		cmd := exec.CommandContext(ctx, binary, args...)
		if c.env != "" {
			cmd.Env = append(cmd.Environ(), c.env)
		}
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("serve %s%s: %v, output %q; want a failure naming %s", c.flag, c.env, err, out, c.want)
		}
	}
}
