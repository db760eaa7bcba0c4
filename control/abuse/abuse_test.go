package abuse_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/abuse"
	"github.com/sluicehq/sluice/control/controltest"
	"github.com/sluicehq/sluice/control/postgres"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
	"github.com/sluicehq/sluice/policy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is where every test's clock starts: half a minute into a minute.
var t0 = time.Date(2026, 5, 6, 12, 0, 30, 0, time.UTC)

// opener opens another Store on one test database, as another node of a fleet does.
type opener func() control.Store

// backends are the real databases the detector runs on.
var backends = []struct {
	name string
	db   func(t testing.TB, clock *controltest.Clock) opener
}{
	{"sqlite", func(t testing.TB, clock *controltest.Clock) opener {
		path := sqlite.Path(filepath.Join(t.TempDir(), "data"))
		return func() control.Store {
			s, err := sqlite.Open(t.Context(), path, control.Options{Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	}},
	{"postgres", pgOpener},
}

func pgOpener(t testing.TB, clock *controltest.Clock) opener {
	url := pgtest.DB(t)
	return func() control.Store {
		s, err := postgres.Open(t.Context(), url, control.Options{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// node is one detector with its own Store and metrics.
type node struct {
	store control.Store
	det   *abuse.Detector
	m     *abuse.Metrics
}

func newNode(t *testing.T, open opener, clock *controltest.Clock, holder string, cfg abuse.Config) *node {
	t.Helper()
	st := open()
	m := abuse.NewMetrics(prometheus.NewRegistry())
	d, err := abuse.New(abuse.Options{Store: st, Holder: holder, Config: cfg, Metrics: m, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &node{store: st, det: d, m: m}
}

// feed adds counts as the nodes' event writers do.
func feed(t *testing.T, s control.Store, usage []control.UsageCount, violations ...control.ViolationCount) {
	t.Helper()
	if err := s.AddCounts(context.Background(), usage, violations); err != nil {
		t.Fatalf("AddCounts: %v", err)
	}
}

// automatic returns the active automatic overrides by target.
func automatic(t *testing.T, s control.Store) map[string]control.Override {
	t.Helper()
	list, err := s.ListOverrides(context.Background(), control.OverrideFilter{Source: control.SourceAutomatic})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]control.Override{}
	for _, o := range list {
		switch {
		case o.IP != "":
			out["ip "+o.IP] = o
		case o.APIKeyHash != "":
			out["api_key "+o.APIKeyHash] = o
		default:
			out[o.Tenant+"|"+o.User] = o
		}
	}
	return out
}

func TestDetectorPenalizesNoisyTenants(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clock := controltest.NewClock(t0)
			n := newNode(t, b.db(t, clock), clock, "node-a", abuse.DefaultConfig())
			ctx := t.Context()
			m := t0.Truncate(time.Minute).Add(-2 * time.Minute) // inside the 5-minute window
			u := func(rule, tenant string, allowed, denied, soft int64) control.UsageCount {
				return control.UsageCount{Minute: m, Rule: rule, Tenant: tenant, Allowed: allowed, Denied: denied, Soft: soft}
			}
			feed(t, n.store, []control.UsageCount{
				u("r", "noisy", 10, 80, 10),  // 90% of 100: high
				u("r", "calm", 90, 10, 0),    // 10%
				u("r", "few", 0, 99, 0),      // 100%, but 99 requests
				u("r", "covered", 0, 200, 0), // 100%, but an operator's override names it
				u("r", "medium", 30, 70, 0),  // 70%: medium
				u("r", "edge", 20, 80, 0),    // exactly the threshold is not above it: medium
				// 90% on rule a; a generous rule b it never reaches does not dilute it.
				u("a", "multi", 20, 180, 0), u("b", "multi", 1000, 0, 0),
				// Requests without a tenant: 10 allowed among all of them, so bot's share is at
				// least 200/210 and the IP's 100/110.
				u("a", "", 10, 300, 0),
				{Minute: m.Add(-4 * time.Minute), Rule: "r", Tenant: "old", Denied: 1000}, // before the window
				u("r", "old", 1, 0, 0),
			},
				control.ViolationCount{Minute: m, Rule: "a", User: "bot", IP: "192.0.2.1", Denied: 150},
				control.ViolationCount{Minute: m.Add(time.Minute), Rule: "a", User: "bot", IP: "192.0.2.2", Soft: 50},
				control.ViolationCount{Minute: m, Rule: "a", IP: "192.0.2.7", Denied: 100},
				control.ViolationCount{Minute: m, Rule: "a", Tenant: "multi", User: "x", Denied: 180}, // judged as multi
			)
			if _, err := n.store.CreateOverride(ctx, control.Change{Actor: "alice"}, control.Override{
				Tenant: "covered", Endpoint: "/upload", Type: control.OverrideCustom, Limit: 1000, ExpiresAt: t0.Add(time.Hour), Reason: "a big customer", Source: control.SourceAPI,
			}); err != nil {
				t.Fatal(err)
			}

			if s := n.det.Step(ctx); s != abuse.StatusOK {
				t.Fatalf("Step = %q, want ok", s)
			}
			got := automatic(t, n.store)
			want := map[string]string{
				"noisy|": "automatic abuse detection: 90% throttled over 5m",
				"multi|": "automatic abuse detection: 90% throttled over 5m",
				"|bot":   "automatic abuse detection: 95% throttled over 5m",
				// 100 throttled of 110 requests without a tenant, at least: 90%.
				"ip 192.0.2.7": "automatic abuse detection: 90% throttled over 5m",
			}
			if len(got) != len(want) {
				t.Errorf("automatic overrides: %v, want %v", keys(got), want)
			}
			for target, reason := range want {
				o, ok := got[target]
				if !ok {
					t.Errorf("no automatic override for %q", target)
					continue
				}
				if o.Type != control.OverrideMultiplier || o.Value != 0.1 || !o.ExpiresAt.Equal(t0.Add(5*time.Minute)) ||
					o.CreatedBy != control.ActorAbuseDetector || o.Reason != reason || o.Rule != "" || o.Endpoint != "" {
					t.Errorf("override for %q = %+v; want a multiplier of 0.1 until %v by abuse-detector, reason %q", target, o, t0.Add(5*time.Minute), reason)
				}
			}
			events, err := n.store.Audit(ctx, control.AuditFilter{Actor: control.ActorAbuseDetector})
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != 4 {
				t.Errorf("%d audit events by abuse-detector, want 4: %+v", len(events), events)
			}
			for _, e := range events {
				if e.Kind != control.KindOverride || e.Action != control.ActionCreate || !strings.HasPrefix(e.Reason, "automatic abuse detection: ") {
					t.Errorf("audit event %+v", e)
				}
			}
			// high: noisy, multi, bot and the IP; medium: medium, edge.
			checkCounts(t, n.m, map[string]float64{"high": 4, "medium": 2, "ok": 1, "applied": 4})

			// The next run: the penalized are covered, the rest is flagged again; nothing new.
			clock.Advance(time.Minute)
			if s := n.det.Step(ctx); s != abuse.StatusOK {
				t.Fatalf("second Step = %q", s)
			}
			if got := automatic(t, n.store); len(got) != 4 {
				t.Errorf("after the second run: %v", keys(got))
			}
			checkCounts(t, n.m, map[string]float64{"high": 4, "medium": 4, "ok": 2, "applied": 4})

			// The penalty expires on time: active until t0+5m, gone from then on.
			clock.Advance(4*time.Minute - time.Microsecond)
			if got := automatic(t, n.store); len(got) != 4 {
				t.Errorf("a microsecond before the end: %v", keys(got))
			}
			clock.Advance(time.Microsecond)
			if got := automatic(t, n.store); len(got) != 0 {
				t.Errorf("at the end of the penalty: %v still active", keys(got))
			}
			st, err := n.store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range st.Overrides {
				if o.Source == control.SourceAutomatic {
					t.Errorf("the compile step still gets %+v", o)
				}
			}
		})
	}
}

// TestPenaltiesAreCapped (issue 27): a probe that makes up 200 tenant names, each throttled
// above the threshold, gets --abuse-max-penalties overrides per run, the worst offenders
// first; the rest are flagged, counted as skipped, and judged again at the next run.
func TestPenaltiesAreCapped(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clock := controltest.NewClock(t0)
			cfg := abuse.DefaultConfig()
			if cfg.MaxPenalties != 50 {
				t.Fatalf("the default cap is %d, want 50", cfg.MaxPenalties)
			}
			n := newNode(t, b.db(t, clock), clock, "node-a", cfg)
			ctx := t.Context()
			m := t0.Truncate(time.Minute).Add(-time.Minute)
			const probes = 200
			usage := make([]control.UsageCount, probes)
			for i := range usage {
				// Shares from 100/120 (0.83) up, all above the threshold, growing with i: the
				// worst offenders are the last names.
				usage[i] = control.UsageCount{Minute: m, Rule: "r", Tenant: fmt.Sprintf("probe-%03d", i), Allowed: 20, Denied: int64(100 + i)}
			}
			feed(t, n.store, usage)

			if s := n.det.Step(ctx); s != abuse.StatusOK {
				t.Fatalf("Step = %q, want ok", s)
			}
			got := automatic(t, n.store)
			if len(got) != cfg.MaxPenalties {
				t.Fatalf("%d automatic overrides after one run, want the cap, %d", len(got), cfg.MaxPenalties)
			}
			for i := probes - cfg.MaxPenalties; i < probes; i++ {
				if _, ok := got[fmt.Sprintf("probe-%03d|", i)]; !ok {
					t.Errorf("probe-%03d, among the worst %d, is not penalized", i, cfg.MaxPenalties)
				}
			}
			checkCounts(t, n.m, map[string]float64{"high": probes, "applied": 50})
			if s := n.m.Skipped(); s != probes-50 {
				t.Errorf("sluice_abuse_penalties_skipped_total = %v, want %d", s, probes-50)
			}

			// The next run penalizes the next worst 50; the first 50 are covered.
			clock.Advance(time.Minute)
			if s := n.det.Step(ctx); s != abuse.StatusOK {
				t.Fatalf("second Step = %q", s)
			}
			got = automatic(t, n.store)
			if len(got) != 2*cfg.MaxPenalties {
				t.Fatalf("%d automatic overrides after two runs, want %d", len(got), 2*cfg.MaxPenalties)
			}
			for i := probes - 2*cfg.MaxPenalties; i < probes; i++ {
				if _, ok := got[fmt.Sprintf("probe-%03d|", i)]; !ok {
					t.Errorf("probe-%03d is not penalized after two runs", i)
				}
			}
			if s := n.m.Skipped(); s != probes-50+probes-100 {
				t.Errorf("sluice_abuse_penalties_skipped_total = %v after two runs, want %d", s, probes-50+probes-100)
			}
		})
	}
}

func TestDetectSkipsBeyondTheCap(t *testing.T) {
	t.Parallel()
	clock := controltest.NewClock(t0)
	cfg := abuse.DefaultConfig()
	cfg.MaxPenalties = 1
	n := newNode(t, backends[0].db(t, clock), clock, "node-a", cfg)
	m := t0.Truncate(time.Minute)
	feed(t, n.store, []control.UsageCount{
		{Minute: m, Rule: "r", Tenant: "a", Allowed: 10, Denied: 90},  // 90%
		{Minute: m, Rule: "r", Tenant: "b", Allowed: 5, Denied: 95},   // 95%: the worst
		{Minute: m, Rule: "r", Tenant: "c", Allowed: 10, Denied: 180}, // 94.7%
	})
	flags, err := n.det.Detect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		tenant           string
		penalized, skips bool
	}
	var rows []row
	for _, f := range flags {
		rows = append(rows, row{f.Target.Tenant, f.Override != nil, f.Skipped})
	}
	want := []row{{"a", false, true}, {"b", true, false}, {"c", false, true}}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("flags (tenant, penalized, skipped) = %v, want %v", rows, want)
	}
}

func keys(m map[string]control.Override) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func checkCounts(t *testing.T, m *abuse.Metrics, want map[string]float64) {
	t.Helper()
	got := map[string]float64{
		"high": m.Flags(abuse.SeverityHigh), "medium": m.Flags(abuse.SeverityMedium),
		"ok": m.Runs(abuse.StatusOK), "applied": m.Applied("multiplier", "automatic"),
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], w, got)
		}
	}
}

// TestPenaltyIsNotHeldAgainstItsTarget: the requests a penalty throttles do not earn the next
// penalty. A caller going at its usual pace is mostly throttled while its limits are a tenth;
// once the penalty ends it is judged on a window that no longer holds any of those minutes.
func TestPenaltyIsNotHeldAgainstItsTarget(t *testing.T) {
	clock := controltest.NewClock(t0)
	n := newNode(t, backends[0].db(t, clock), clock, "node-a", abuse.DefaultConfig())
	ctx := t.Context()
	minute := func(i int) time.Time { return t0.Truncate(time.Minute).Add(time.Duration(i) * time.Minute) }
	count := func(i int, allowed, denied int64) control.UsageCount {
		return control.UsageCount{Minute: minute(i), Rule: "r", Tenant: "acme", Allowed: allowed, Denied: denied}
	}
	step := func() {
		t.Helper()
		if s := n.det.Step(ctx); s != abuse.StatusOK {
			t.Fatalf("Step at %v = %q", clock.Now(), s)
		}
	}
	feed(t, n.store, []control.UsageCount{count(0, 10, 90)})
	step()
	o, ok := automatic(t, n.store)["acme|"]
	if !ok {
		t.Fatal("the noisy tenant was not penalized")
	}
	// Under the penalty (12:00:30 to 12:05:30) the caller goes at its usual pace: 85% denied.
	for i := 1; i <= 5; i++ {
		feed(t, n.store, []control.UsageCount{count(i, 15, 85)})
	}
	for clock.Now().Before(o.ExpiresAt.Add(4 * time.Minute)) {
		clock.Advance(time.Minute)
		step()
		for _, again := range automatic(t, n.store) {
			if again.ID != o.ID {
				t.Fatalf("at %v, penalized again for what its penalty throttled: %+v", clock.Now(), again)
			}
		}
	}
	// Noisy again on its own: from 12:11, no minute of the window overlaps the penalty.
	feed(t, n.store, []control.UsageCount{count(11, 5, 95)})
	clock.Advance(minute(11).Add(30 * time.Second).Sub(clock.Now()))
	step()
	if _, ok := automatic(t, n.store)["acme|"]; !ok {
		t.Fatalf("noisy again after the penalty and its window, not penalized")
	}
}

// TestOneNodeRunsTheDetector: two nodes on one PostgreSQL; only the lease holder runs, once per
// interval; when it stops renewing (killed), the other takes over within two intervals, and a
// holder that closes hands over at the other's next step.
func TestOneNodeRunsTheDetector(t *testing.T) {
	clock := controltest.NewClock(t0)
	open := pgOpener(t, clock)
	cfg := abuse.DefaultConfig()
	a := newNode(t, open, clock, "node-a", cfg)
	b := newNode(t, open, clock, "node-b", cfg)
	ctx := t.Context()
	half := cfg.Interval / 2

	if s := a.det.Step(ctx); s != abuse.StatusOK {
		t.Fatalf("first node's first step = %q", s)
	}
	if s := b.det.Step(ctx); s != abuse.StatusNotLeader {
		t.Fatalf("second node's first step = %q", s)
	}
	const intervals = 10
	for i := range 2 * intervals {
		clock.Advance(half)
		// Either order: the holder's renewal never lapses between steps.
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		first.det.Step(ctx)
		second.det.Step(ctx)
	}
	for _, c := range []struct {
		name string
		n    *node
		s    abuse.Status
		want float64
	}{
		{"a ok", a, abuse.StatusOK, 1 + intervals}, {"a not_leader", a, abuse.StatusNotLeader, 0},
		{"b ok", b, abuse.StatusOK, 0}, {"b not_leader", b, abuse.StatusNotLeader, 1 + intervals},
		{"a error", a, abuse.StatusError, 0}, {"b error", b, abuse.StatusError, 0},
	} {
		if got := c.n.m.Runs(c.s); got != c.want {
			t.Errorf("%s: %v runs, want %v", c.name, got, c.want)
		}
	}

	// a is killed: it stops stepping and never releases. b takes over within two intervals of
	// a's last renewal, and runs at once.
	killed := clock.Now()
	for {
		clock.Advance(half)
		if b.det.Step(ctx) == abuse.StatusOK {
			break
		}
		if clock.Now().Sub(killed) > 2*cfg.Interval {
			t.Fatalf("b did not take over within two intervals of a's last renewal")
		}
	}
	t.Logf("b took over %v after a's last renewal (interval %v)", clock.Now().Sub(killed), cfg.Interval)
	if s := a.det.Step(ctx); s != abuse.StatusNotLeader {
		t.Errorf("a back after b took over: %q, want not_leader", s)
	}

	// b closes: it releases the lease, and a takes over at its next step.
	b.det.Close()
	clock.Advance(half)
	if s := a.det.Step(ctx); s != abuse.StatusOK {
		t.Errorf("a after b closed: %q, want ok at once", s)
	}
	if holder, _, err := a.store.Lease(ctx, abuse.LeaseName); err != nil || holder != "node-a" {
		t.Errorf("lease holder = %q, %v", holder, err)
	}
}

// TestStartAndClose runs the detector's own loop on the real clock: it takes the free lease at
// once, and Close gives it up.
func TestStartAndClose(t *testing.T) {
	clock := controltest.NewClock(time.Now())
	st := backends[0].db(t, clock)()
	cfg := abuse.DefaultConfig()
	m := abuse.NewMetrics(prometheus.NewRegistry())
	d, err := abuse.New(abuse.Options{Store: st, Holder: "node-a", Config: cfg, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(t.Context())
	deadline := time.Now().Add(10 * time.Second)
	for m.Runs(abuse.StatusOK) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first run did not happen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.Close()
	if _, _, err := st.Lease(t.Context(), abuse.LeaseName); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("after Close, the lease: %v; want released", err)
	}
}

func TestJudge(t *testing.T) {
	t.Parallel()
	m := time.Date(2026, 5, 6, 12, 0, 0, 0, time.UTC)
	u := func(rule, tenant string, allowed, denied, soft int64) control.UsageCount {
		return control.UsageCount{Minute: m, Rule: rule, Tenant: tenant, Allowed: allowed, Denied: denied, Soft: soft}
	}
	v := func(rule, user, apiKey, ip string, denied, soft int64) control.ViolationCount {
		return control.ViolationCount{Minute: m, Rule: rule, User: user, APIKey: apiKey, IP: ip, Denied: denied, Soft: soft}
	}
	type flag struct {
		target        abuse.Target
		rule          string
		throttled, of int64
		severity      string
	}
	for _, tc := range []struct {
		name  string
		usage []control.UsageCount
		viols []control.ViolationCount
		want  []flag
	}{
		{"soft counts as throttled", []control.UsageCount{u("r", "t", 10, 45, 45)}, nil,
			[]flag{{abuse.Target{Tenant: "t"}, "r", 90, 100, "high"}}},
		{"the largest share of one rule, not the sum over rules",
			[]control.UsageCount{u("a", "t", 20, 180, 0), u("b", "t", 1000, 0, 0), u("c", "t", 50, 50, 0)}, nil,
			[]flag{{abuse.Target{Tenant: "t"}, "a", 180, 200, "high"}}},
		{"min requests applies per rule",
			[]control.UsageCount{u("a", "t", 0, 99, 0), u("b", "t", 30, 70, 0)}, nil,
			[]flag{{abuse.Target{Tenant: "t"}, "b", 70, 100, "medium"}}},
		{"below medium", []control.UsageCount{u("r", "t", 41, 59, 0)}, nil, nil},
		{"medium from 0.6", []control.UsageCount{u("r", "t", 40, 60, 0)}, nil,
			[]flag{{abuse.Target{Tenant: "t"}, "r", 60, 100, "medium"}}},
		{"an identity's share counts every tenant-less allowed request",
			[]control.UsageCount{u("r", "", 100, 400, 0)},
			[]control.ViolationCount{v("r", "bot", "", "192.0.2.1", 300, 0), v("r", "", "", "192.0.2.9", 100, 0)},
			[]flag{{abuse.Target{User: "bot"}, "r", 300, 400, "medium"}}},
		{"one user across IPs and keys adds up",
			[]control.UsageCount{u("r", "", 5, 200, 0)},
			[]control.ViolationCount{v("r", "bot", "", "192.0.2.1", 60, 0), v("r", "bot", "#ab", "192.0.2.2", 40, 0), v("r", "bot", "", "", 0, 100)},
			[]flag{{abuse.Target{User: "bot"}, "r", 200, 205, "high"}}},
		{"identities without a user: the API key, else the IP",
			[]control.UsageCount{u("r", "", 0, 300, 0)},
			[]control.ViolationCount{v("r", "", "#ab", "192.0.2.1", 150, 0), v("r", "", "", "192.0.2.1", 150, 0), v("r", "", "", "", 500, 0)},
			[]flag{{abuse.Target{APIKey: "#ab"}, "r", 150, 150, "high"}, {abuse.Target{IP: "192.0.2.1"}, "r", 150, 150, "high"}}},
		{"min requests counts an identity's throttled requests only",
			[]control.UsageCount{u("r", "", 0, 99, 0)},
			[]control.ViolationCount{v("r", "bot", "", "", 99, 0)}, nil},
		{"order: tenants, then users",
			[]control.UsageCount{u("r", "zeta", 0, 100, 0), u("r", "alpha", 0, 100, 0), u("r", "", 0, 100, 0)},
			[]control.ViolationCount{v("r", "aaron", "", "", 100, 0)},
			[]flag{{abuse.Target{Tenant: "alpha"}, "r", 100, 100, "high"}, {abuse.Target{Tenant: "zeta"}, "r", 100, 100, "high"},
				{abuse.Target{User: "aaron"}, "r", 100, 100, "high"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []flag
			for _, f := range abuse.DefaultConfig().Judge(tc.usage, tc.viols) {
				got = append(got, flag{f.Target, f.Rule, f.Throttled, f.Requests, f.Severity})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		percent int64
		window  time.Duration
		want    string
	}{
		{85, 5 * time.Minute, "automatic abuse detection: 85% throttled over 5m"},
		{100, time.Hour, "automatic abuse detection: 100% throttled over 1h"},
		{80, 90 * time.Second, "automatic abuse detection: 80% throttled over 90s"},
	} {
		if got := abuse.Reason(tc.percent, tc.window); got != tc.want {
			t.Errorf("Reason(%d, %v) = %q, want %q", tc.percent, tc.window, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := abuse.DefaultConfig().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	nan := 0.0
	nan /= nan
	for _, tc := range []struct {
		name  string
		set   func(*abuse.Config)
		field string
	}{
		{"interval 0", func(c *abuse.Config) { c.Interval = 0 }, "interval"},
		{"interval below a second", func(c *abuse.Config) { c.Interval = 500 * time.Millisecond }, "interval"},
		{"window below a minute", func(c *abuse.Config) { c.Window = 30 * time.Second }, "window"},
		{"window above a day", func(c *abuse.Config) { c.Window = 25 * time.Hour }, "window"},
		{"threshold 0", func(c *abuse.Config) { c.Threshold = 0 }, "threshold"},
		{"threshold 1", func(c *abuse.Config) { c.Threshold = 1 }, "threshold"},
		{"threshold NaN", func(c *abuse.Config) { c.Threshold = nan }, "threshold"},
		{"min requests 0", func(c *abuse.Config) { c.MinRequests = 0 }, "min-requests"},
		{"multiplier 0", func(c *abuse.Config) { c.Multiplier = 0 }, "multiplier"},
		{"multiplier 1 is no penalty", func(c *abuse.Config) { c.Multiplier = 1 }, "multiplier"},
		{"multiplier NaN", func(c *abuse.Config) { c.Multiplier = nan }, "multiplier"},
		{"penalty negative", func(c *abuse.Config) { c.Penalty = -time.Minute }, "penalty"},
		{"penalty above 30 days", func(c *abuse.Config) { c.Penalty = 31 * 24 * time.Hour }, "penalty"},
		{"max penalties 0", func(c *abuse.Config) { c.MaxPenalties = 0 }, "max-penalties"},
		{"max penalties negative", func(c *abuse.Config) { c.MaxPenalties = -1 }, "max-penalties"},
		{"max penalties above the bound", func(c *abuse.Config) { c.MaxPenalties = abuse.MaxMaxPenalties + 1 }, "max-penalties"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := abuse.DefaultConfig()
			tc.set(&c)
			var fe *policy.FieldError
			if err := c.Validate(); !errors.As(err, &fe) || fe.Field != tc.field {
				t.Errorf("Validate() = %v, want an error naming %s", err, tc.field)
			}
		})
	}
	if _, err := abuse.New(abuse.Options{Store: nil, Holder: "n", Config: abuse.DefaultConfig()}); err == nil {
		t.Error("New without a store")
	}
}

// TestStepCountsErrors: a control store that fails makes a due step an error, counted, and
// the detector goes on.
func TestStepCountsErrors(t *testing.T) {
	clock := controltest.NewClock(t0)
	n := newNode(t, backends[0].db(t, clock), clock, "node-a", abuse.DefaultConfig())
	n.store.Close()
	for range 2 {
		if s := n.det.Step(t.Context()); s != abuse.StatusError {
			t.Errorf("Step on a closed store = %q, want error", s)
		}
		clock.Advance(abuse.DefaultInterval)
	}
	if got := n.m.Runs(abuse.StatusError); got != 2 {
		t.Errorf("error runs = %v, want 2", got)
	}
}
