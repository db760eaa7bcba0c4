package metrics_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

func TestRequestsWithoutIdentityCounted(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	for _, anonymous := range []bool{true, false, true} {
		m.ObserveCheck("http", &sluice.Decision{Allowed: true, Anonymous: anonymous}, 0)
	}
	m.ObserveCheck("grpc", &sluice.Decision{Allowed: true, Anonymous: true}, 0)
	for api, want := range map[string]float64{"http": 2, "grpc": 1} {
		if got := counterValue(t, reg, api); got != want {
			t.Errorf("sluice_requests_without_identity_total{api=%q} = %v, want %v", api, got, want)
		}
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, api string) float64 {
	t.Helper()
	return gathered(t, reg)["sluice_requests_without_identity_total{api="+api+"}"]
}

// gathered reads every counter and gauge of reg, each under its name and its labels as
// name{label=value,...} (the name alone when it has none).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			var labels []string
			for _, l := range metric.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			if c := metric.GetCounter(); c != nil {
				got[name] = c.GetValue()
			} else if g := metric.GetGauge(); g != nil {
				got[name] = g.GetValue()
			}
		}
	}
	return got
}

func TestTenantThrottleReplacesTheSet(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	set := metrics.New(reg, "memory").TenantThrottle()
	set(map[string]float64{"a": 0.5, "b": 0.25})
	set(map[string]float64{"b": 0.75})
	got := map[string]float64{}
	for name, v := range gathered(t, reg) {
		if tenant, ok := strings.CutPrefix(name, "sluice_tenant_throttle_ratio{tenant="); ok {
			got[strings.TrimSuffix(tenant, "}")] = v
		}
	}
	if len(got) != 1 || got["b"] != 0.75 {
		t.Fatalf("sluice_tenant_throttle_ratio = %v, want only b = 0.75 (the last set replaces the earlier)", got)
	}
}

// TestObserveDescriptorsAllocatesNothing: an RLS decision under an unnamed limit is counted
// under domain/id, with its hits in sluice_envoy_stats_total, without building that label on
// every call.
func TestObserveDescriptorsAllocatesNothing(t *testing.T) {
	cfg, err := envoyconf.Load(map[string][]byte{"rls.yaml": []byte("domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")}, false)
	if err != nil {
		t.Fatal(err)
	}
	lim := cfg.Limits("bench")[0]
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	d := &sluice.DescriptorDecision{OK: true, Statuses: []sluice.DescriptorStatus{{OK: true, HasLimit: true, Limit: lim, RequestsPerUnit: 10, Remaining: 9, Hits: 1}}}
	req := userRequest("u1")
	m.ObserveDescriptors("rls", req, d, time.Millisecond) // creates the counter
	if n := testing.AllocsPerRun(100, func() { m.ObserveDescriptors("rls", req, d, time.Millisecond) }); n != 0 {
		t.Fatalf("%v allocations per decision, want 0", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["rule"] == "bench/user" && mt.GetCounter() != nil {
				got[mf.GetName()+"/"+labels["stat"]] += mt.GetCounter().GetValue()
			}
		}
	}
	// AllocsPerRun runs once more than asked: 102 decisions of one hit each, within the limit.
	want := map[string]float64{"sluice_checks_total/": 102, "sluice_envoy_stats_total/total_hits": 102, "sluice_envoy_stats_total/within_limit": 102,
		"sluice_envoy_stats_total/near_limit": 0, "sluice_envoy_stats_total/over_limit": 0, "sluice_envoy_stats_total/shadow_mode": 0}
	if !maps.Equal(got, want) {
		t.Fatalf("bench/user counted %v, want %v", got, want)
	}
}

// BenchmarkObserveDescriptors: what counting one RLS descriptor costs, without hits (the
// decision count alone, as before sluice_envoy_stats_total) and with them.
func BenchmarkObserveDescriptors(b *testing.B) {
	cfg, err := envoyconf.Load(map[string][]byte{"rls.yaml": []byte("domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")}, false)
	if err != nil {
		b.Fatal(err)
	}
	lim := cfg.Limits("bench")[0]
	for _, hits := range []uint64{0, 1} {
		b.Run(fmt.Sprintf("hits=%d", hits), func(b *testing.B) {
			m := metrics.New(prometheus.NewRegistry(), "memory")
			d := &sluice.DescriptorDecision{OK: true, Statuses: []sluice.DescriptorStatus{{OK: true, HasLimit: true, Limit: lim, RequestsPerUnit: 10, Remaining: 1, Hits: hits}}}
			req := userRequest("u1")
			b.ReportAllocs()
			for b.Loop() {
				m.ObserveDescriptors("rls", req, d, time.Millisecond)
			}
		})
	}
}

// userRequest is an RLS request of domain bench with one descriptor, user=value.
func userRequest(value string) *sluice.DescriptorRequest {
	return &sluice.DescriptorRequest{Domain: "bench", Descriptors: []sluice.Descriptor{{Entries: []envoyconf.Entry{{Key: "user", Value: value}}}}}
}

// TestEnvoyValueStats: a detailed_metric limit's hits are counted per request value under
// the reference service's names, as its own stats (near and over included); a key seen before
// costs no allocation; past MaxEnvoyValueKeys the hits go to the limit's own key and the
// overflow counter; a drain forgets what it handed over; a limit without per-value names
// never enters the table.
func TestEnvoyValueStats(t *testing.T) {
	cfg, err := envoyconf.Load(map[string][]byte{"rls.yaml": []byte("domain: bench\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")}, false)
	if err != nil {
		t.Fatal(err)
	}
	user, tenant := cfg.Limits("bench")[0], cfg.Limits("bench")[1]
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	m.EnableEnvoyValueStats()
	observe := func(l *envoyconf.Limit, key, value string, remaining uint32, ok bool) {
		req := &sluice.DescriptorRequest{Domain: "bench", Descriptors: []sluice.Descriptor{{Entries: []envoyconf.Entry{{Key: key, Value: value}}}}}
		d := &sluice.DescriptorDecision{OK: ok, Statuses: []sluice.DescriptorStatus{{OK: ok, HasLimit: true, Limit: l, RequestsPerUnit: 10, Remaining: remaining, Hits: 1}}}
		m.ObserveDescriptors("rls", req, d, time.Millisecond)
	}
	observe(user, "user", "alice", 9, true)  // 1 of 10: within
	observe(user, "user", "alice", 1, true)  // 9 of 10: within and near
	observe(user, "user", "bob", 0, false)   // denied at 10 of 10: over
	observe(tenant, "tenant", "t1", 9, true) // no per-value name
	req := &sluice.DescriptorRequest{Domain: "bench", Descriptors: []sluice.Descriptor{{Entries: []envoyconf.Entry{{Key: "user", Value: "alice"}}}}}
	d := &sluice.DescriptorDecision{OK: true, Statuses: []sluice.DescriptorStatus{{OK: true, HasLimit: true, Limit: user, RequestsPerUnit: 10, Remaining: 5, Hits: 1}}}
	if n := testing.AllocsPerRun(50, func() { m.ObserveDescriptors("rls", req, d, time.Millisecond) }); n != 0 {
		t.Errorf("%v allocations per decision under a known per-value key, want 0", n)
	}
	drain := func() map[string]metrics.EnvoyHits {
		got := map[string]metrics.EnvoyHits{}
		m.DrainEnvoyValueStats(func(k string, h metrics.EnvoyHits) { got[k] = h })
		return got
	}
	got := drain()
	want := map[string]metrics.EnvoyHits{
		"bench.user_alice": {Total: 53, Within: 53, Near: 1},
		"bench.user_bob":   {Total: 1, Over: 1},
	}
	if !maps.Equal(got, want) {
		t.Fatalf("per-value stats %v, want %v", got, want)
	}
	off := metrics.New(prometheus.NewRegistry(), "memory")
	off.ObserveDescriptors("rls", req, d, time.Millisecond)
	off.DrainEnvoyValueStats(func(k string, _ metrics.EnvoyHits) { t.Errorf("without a reader, %s was kept", k) })
	if again := drain(); len(again) != 0 {
		t.Fatalf("a second drain handed over %v, want nothing", again)
	}
	for i := range metrics.MaxEnvoyValueKeys + 5 {
		observe(user, "user", fmt.Sprintf("u%d", i), 9, true)
	}
	got = drain()
	if len(got) != metrics.MaxEnvoyValueKeys+1 || got["bench.user"].Total != 5 {
		t.Fatalf("past the bound: %d keys, bench.user %+v; want %d keys and 5 hits under bench.user", len(got), got["bench.user"], metrics.MaxEnvoyValueKeys+1)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	overflow := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "sluice_envoy_value_stats_overflow_total" {
			overflow = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if overflow != 5 {
		t.Fatalf("sluice_envoy_value_stats_overflow_total = %v, want 5", overflow)
	}
}

// TestWatchRedis: the Redis store's figures are read when scraped, each under its name.
func TestWatchRedis(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "redis")
	stats := metrics.RedisStats{ScriptCalls: 3, ScriptBatches: 40, PlainDecided: 500, PlainFellBack: 7, Redirects: 2, RoutedSlots: 16384}
	m.WatchRedis(func() metrics.RedisStats { return stats })
	stats.PlainDecided = 501 // read at the scrape, not at the watch
	got := gathered(t, reg)
	for name, want := range map[string]float64{
		"sluice_redis_script_calls_total":                     3,
		"sluice_redis_script_batches_total":                   40,
		"sluice_redis_plain_batches_total{outcome=decided}":   501,
		"sluice_redis_plain_batches_total{outcome=fell_back}": 7,
		"sluice_redis_cluster_redirects_total":                2,
		"sluice_redis_cluster_routed_slots":                   16384,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}
