package fleetstats

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/telemetry/usage"
)

type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func observe(c *Collector, rule, user string, o usage.Outcome, n int) {
	for range n {
		c.Observe(usage.Observation{Rule: rule, Tenant: "acme", User: user, Outcome: o})
	}
}

func TestRatesTotalsAndTop(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := New(Options{Node: "n1", Store: "memory", Now: clk.Now})
	// 10 s of traffic: each second 30 allowed, 5 soft, 5 denied on per-user; bob is heaviest.
	for range 10 {
		observe(c, "per-user", "bob", usage.OutcomeAllowed, 20)
		observe(c, "per-user", "ann", usage.OutcomeAllowed, 10)
		observe(c, "per-user", "bob", usage.OutcomeSoft, 5)
		observe(c, "per-user", "bob", usage.OutcomeDenied, 5)
		clk.add(time.Second)
	}
	clk.add(-time.Second + time.Millisecond) // still in the last second
	s := c.Snapshot()
	if len(s.Rules) != 1 {
		t.Fatalf("rules %+v", s.Rules)
	}
	r := s.Rules[0]
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"allowed/s", r.Rate.Allowed, 30},
		{"soft/s", r.Rate.Soft, 5},
		{"denied/s", r.Rate.Denied, 5},
		{"total allowed", float64(r.Total.Allowed), 300},
		{"total denied", float64(r.Total.Denied), 50},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if len(r.Top.Counters) != 2 || r.Top.Counters[0].Key != Consumer("acme", "bob", "", "") || r.Top.Counters[0].Count != 300 {
		t.Errorf("top %+v", r.Top)
	}
	// 20 s later the rates are 0, the totals stay, and the top has aged out after two windows.
	clk.add(20 * time.Second)
	if r := c.Snapshot().Rules[0]; r.Rate != (Rates{}) || r.Total.Allowed != 300 {
		t.Errorf("after 20 s idle: %+v", r)
	}
	clk.add(2 * DefaultTopWindow)
	if r := c.Snapshot().Rules[0]; len(r.Top.Counters) != 0 {
		t.Errorf("top after two windows idle: %+v", r.Top)
	}
}

func TestMaxRules(t *testing.T) {
	t.Parallel()
	c := New(Options{MaxRules: 2, Now: newClock().Now})
	for _, r := range []string{"a", "b", "c", "d"} {
		observe(c, r, "u", usage.OutcomeAllowed, 1)
	}
	s := c.Snapshot()
	if len(s.Rules) != 2 || s.DroppedRules != 2 {
		t.Errorf("rules %d dropped %d, want 2 and 2", len(s.Rules), s.DroppedRules)
	}
}

func TestConsumer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, tenant, user, key, ip, want string
	}{
		{"api key first", "acme", "bob", "#abc", "10.0.0.1", "api_key:#abc"},
		{"then user", "acme", "bob", "", "10.0.0.1", "user:bob"},
		{"then ip", "", "", "", "10.0.0.1", "ip:10.0.0.1"},
		{"nothing", "acme", "", "", "", ""},
	} {
		tenant, id := splitConsumer(Consumer(tc.tenant, tc.user, tc.key, tc.ip))
		if tenant != tc.tenant || id != tc.want {
			t.Errorf("%s: %q %q, want %q %q", tc.name, tenant, id, tc.tenant, tc.want)
		}
	}
}

// TestLatencyAndBreaker reads the p99 of the decisions of the window from the metrics'
// histogram, and the breaker's state from its gauge.
func TestLatencyAndBreaker(t *testing.T) {
	t.Parallel()
	clk := newClock()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: durationMetric, Buckets: []float64{1e-4, 1e-3, 1e-2}}, []string{"api"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: breakerMetric}, []string{"store"})
	reg.MustRegister(h, g)
	g.WithLabelValues("redis").Set(2)
	// Before the window: slow decisions that must not count once they left it.
	for range 100 {
		h.WithLabelValues("http").Observe(5e-3)
	}
	c := New(Options{Gatherer: reg, Now: clk.Now, StoreUp: func(context.Context) error { return context.DeadlineExceeded }})
	c.Sample(t.Context())
	clk.add(11 * time.Second)
	for range 99 {
		h.WithLabelValues("http").Observe(5e-5)
	}
	h.WithLabelValues("grpc").Observe(5e-4)
	c.Sample(t.Context())
	s := c.Snapshot()
	// 100 decisions: the 99th is in the first bucket (0, 0.1 ms]: 0.1 ms * 99/99.
	if s.Decisions != 100 || s.P99Ms != 0.1 {
		t.Errorf("p99 %v ms of %d decisions, want 0.1 of 100", s.P99Ms, s.Decisions)
	}
	if s.Breaker != "open" || s.StoreUp {
		t.Errorf("breaker %q store up %v, want open and down", s.Breaker, s.StoreUp)
	}
}

// TestLatencyOfFirstDecisions counts the decisions made before the histogram had any series:
// they are in the window, not its base.
func TestLatencyOfFirstDecisions(t *testing.T) {
	t.Parallel()
	clk := newClock()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: durationMetric, Buckets: []float64{1e-4, 1e-3, 1e-2}}, []string{"api"})
	reg.MustRegister(h)
	c := New(Options{Gatherer: reg, Now: clk.Now})
	c.Sample(t.Context()) // no decision yet: the vector has no series
	for range 10 {
		h.WithLabelValues("http").Observe(5e-5)
	}
	for range 3 {
		clk.add(time.Second)
		c.Sample(t.Context())
	}
	if s := c.Snapshot(); s.Decisions != 10 || s.P99Ms != 0.099 {
		t.Errorf("p99 %v ms of %d decisions, want 0.099 of 10 (0.1 ms * 9.9/10)", s.P99Ms, s.Decisions)
	}
}

func TestMergeAndTop(t *testing.T) {
	t.Parallel()
	clk := newClock()
	a, b := New(Options{Node: "a", Now: clk.Now}), New(Options{Node: "b", Now: clk.Now})
	observe(a, "r", "bob", usage.OutcomeAllowed, 7)
	observe(b, "r", "bob", usage.OutcomeDenied, 4)
	observe(b, "r", "ann", usage.OutcomeAllowed, 5)
	observe(b, "s", "ann", usage.OutcomeAllowed, 1)
	// Through JSON, as heartbeats carry them.
	var nodes []NodeStats
	for _, c := range []*Collector{a, b} {
		var n NodeStats
		if err := json.Unmarshal(c.JSON(), &n); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	f := Merge(clk.Now(), nodes)
	if len(f.Nodes) != 2 || len(f.Rules) != 2 || f.Rules[0].Total != (Counts{Allowed: 12, Denied: 4}) {
		t.Errorf("merged %+v", f)
	}
	top := Top(nodes, "r", 1)
	if len(top) != 1 || len(top[0].Consumers) != 1 || top[0].Consumers[0] != (TopConsumer{Tenant: "acme", Consumer: "user:bob", Count: 11}) {
		t.Errorf("top %+v", top)
	}
	if all := Top(nodes, "", 10); len(all) != 2 || len(all[0].Consumers) != 2 {
		t.Errorf("top of every rule %+v", all)
	}
}

// TestObserveTakesTheRecordersTime: an observation stamped by the recorder (At) is counted in
// its second, not the one the collector's clock says; one without At takes the clock's.
func TestObserveTakesTheRecordersTime(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := New(Options{Node: "n1", Store: "memory", Now: clk.Now})
	at := clk.Now().Add(5 * time.Second)
	c.Observe(usage.Observation{Rule: "r", Tenant: "acme", User: "bob", At: at})
	c.Observe(usage.Observation{Rule: "r", Tenant: "acme", User: "bob"})
	r := c.rules["r"]
	for _, want := range []int64{at.Unix(), clk.Now().Unix()} {
		if b := r.buckets[want%int64(len(r.buckets))]; b.sec != want || b.c.Allowed != 1 {
			t.Errorf("second %d: bucket %+v, want one allowed", want, b)
		}
	}
}

// TestLateObservationKeepsTheTop: an observation stamped in a top window before the current one
// (the recorder's time, read before a snapshot rotated) is counted without rotating back, which
// would drop the current window's top.
func TestLateObservationKeepsTheTop(t *testing.T) {
	t.Parallel()
	clk := newClock()
	c := New(Options{Node: "n1", Store: "memory", Now: clk.Now})
	then := clk.Now()
	clk.add(2 * DefaultTopWindow)
	c.Observe(usage.Observation{Rule: "r", Tenant: "acme", User: "bob", At: clk.Now()})
	c.Observe(usage.Observation{Rule: "r", Tenant: "acme", User: "ann", At: then})
	if got := len(c.rules["r"].cur.Summary().Counters); got != 2 {
		t.Errorf("the current window's top holds %d consumers, want 2 (bob and the late ann)", got)
	}
}
