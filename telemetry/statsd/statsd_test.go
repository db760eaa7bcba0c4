package statsd_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/statsd"
	"github.com/sluicehq/sluice/transport/rls"
)

// listener is a StatsD server on loopback: it reads the datagrams a Sink sends.
type listener struct {
	t    *testing.T
	conn net.PacketConn
}

func listen(t *testing.T) *listener {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &listener{t: t, conn: conn}
}

func (l *listener) addr() string { return l.conn.LocalAddr().String() }

// read returns the next n datagrams. The deadline is generous: on loopback a datagram written
// is readable at once, so only a datagram that was never sent waits it out.
func (l *listener) read(n int) []string {
	l.t.Helper()
	var out []string
	buf := make([]byte, 65536)
	for range n {
		l.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, _, err := l.conn.ReadFrom(buf)
		if err != nil {
			l.t.Fatalf("datagram %d of %d: %v", len(out)+1, n, err)
		}
		out = append(out, string(buf[:k]))
	}
	return out
}

// flush sends once and returns the lines of the datagrams it sent, checking each datagram's
// size.
func flush(t *testing.T, s *statsd.Sink, l *listener, reg *prometheus.Registry) []string {
	t.Helper()
	before := counter(t, reg, "sluice_statsd_packets_total")
	if err := s.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	n := int(counter(t, reg, "sluice_statsd_packets_total") - before)
	var lines []string
	for _, p := range l.read(n) {
		if len(p) > statsd.MaxPacket {
			t.Errorf("datagram of %d bytes, over %d", len(p), statsd.MaxPacket)
		}
		lines = append(lines, strings.Split(p, "\n")...)
	}
	return lines
}

// counter returns the value of the series of name with the label pairs kv in reg, or 0.
func counter(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if labels[kv[i]] != kv[i+1] {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// driven are the metrics TestSinkMapping drives; other series of the registry (the control
// store's, and those added later) are left out of its comparisons.
var driven = []string{"sluice_check_duration_seconds_", "sluice_checks_total:", "sluice_policy_info:", "sluice_policy_reloads_total:"}

// sluiceLines keeps the lines of the driven metrics, sorted.
func sluiceLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if slices.ContainsFunc(driven, func(p string) bool { return strings.HasPrefix(l, p) }) {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

func newSink(t *testing.T, addr string, reg *prometheus.Registry, o statsd.Options) *statsd.Sink {
	t.Helper()
	o.Registerer = reg
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s, err := statsd.New(addr, reg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSinkMapping: the registry's series arrive under the names /metrics gives them, labels
// as DogStatsD tags: counters as increases since the last send (none when nothing changed),
// gauges as values, histograms as bucket, count and sum increases.
func TestSinkMapping(t *testing.T) {
	t.Parallel()
	l := listen(t)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	m.PolicyLoaded("v1", nil)
	s := newSink(t, l.addr(), reg, statsd.Options{})

	allowed := &sluice.Decision{Allowed: true, Rule: "per-caller"}
	m.ObserveCheck("http", allowed, 30*time.Microsecond)
	m.ObserveCheck("http", allowed, 200*time.Microsecond)
	m.ObserveCheck("grpc", &sluice.Decision{Rule: "per-caller"}, 30*time.Microsecond)

	want := []string{
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:5e-05",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.0001",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.00025",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.0005",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.001",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.0025",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.005",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.01",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.025",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:0.1",
		"sluice_check_duration_seconds_bucket:1|c|#api:grpc,le:+Inf",
		"sluice_check_duration_seconds_count:1|c|#api:grpc",
		"sluice_check_duration_seconds_sum:0.00003|c|#api:grpc", // no exponent: not every StatsD parser reads one
		"sluice_check_duration_seconds_bucket:1|c|#api:http,le:5e-05",
		"sluice_check_duration_seconds_bucket:1|c|#api:http,le:0.0001",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.00025",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.0005",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.001",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.0025",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.005",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.01",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.025",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:0.1",
		"sluice_check_duration_seconds_bucket:2|c|#api:http,le:+Inf",
		"sluice_check_duration_seconds_count:2|c|#api:http",
		"sluice_check_duration_seconds_sum:0.00023|c|#api:http",
		"sluice_checks_total:1|c|#api:grpc,mode:normal,result:denied,rule:per-caller,state:normal",
		"sluice_checks_total:2|c|#api:http,mode:normal,result:allowed,rule:per-caller,state:normal",
		"sluice_policy_info:1|g|#version:v1",
		"sluice_policy_reloads_total:1|c|#result:ok",
	}
	slices.Sort(want)
	got := sluiceLines(flush(t, s, l, reg))
	// The 25µs bucket holds nothing: an increase of 0 is not sent.
	if !slices.Equal(got, want) {
		t.Fatalf("first send:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Nothing changed: the gauge again, no counter.
	if got := sluiceLines(flush(t, s, l, reg)); !slices.Equal(got, []string{"sluice_policy_info:1|g|#version:v1"}) {
		t.Fatalf("second send: %q", got)
	}

	// One more check: an increase of 1, not the total of 3. A new policy version replaces the
	// old series; the old one is not sent again.
	m.ObserveCheck("http", allowed, 30*time.Microsecond)
	m.PolicyLoaded("v2", nil)
	got = sluiceLines(flush(t, s, l, reg))
	for _, w := range []string{
		"sluice_checks_total:1|c|#api:http,mode:normal,result:allowed,rule:per-caller,state:normal",
		"sluice_check_duration_seconds_count:1|c|#api:http",
		"sluice_policy_info:1|g|#version:v2",
		"sluice_policy_reloads_total:1|c|#result:ok",
	} {
		if !slices.Contains(got, w) {
			t.Errorf("third send lacks %q:\n%s", w, strings.Join(got, "\n"))
		}
	}
	for _, line := range got {
		if strings.Contains(line, "version:v1") {
			t.Errorf("third send still has %q", line)
		}
	}
}

// TestSinkValues: gauges below zero go as 0 then the value (StatsD reads "-5|g" as a
// decrement); a counter whose series was deleted and made again counts from zero; a summary's
// quantiles are gauges; NaN is dropped and counted; TagsInName puts label values in the name.
func TestSinkValues(t *testing.T) {
	t.Parallel()
	l := listen(t)
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "temperature"})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "events_total"}, []string{"kind", "zone"})
	sum := prometheus.NewSummary(prometheus.SummaryOpts{Name: "latency_seconds", Objectives: map[float64]float64{0.5: 0.01}})
	reg.MustRegister(g, c, sum)
	s := newSink(t, l.addr(), reg, statsd.Options{Tags: statsd.TagsInName, Prefix: "edge"})

	g.Set(-5)
	c.WithLabelValues("a.b|c", "").Add(7)
	sum.Observe(2)
	lines := flush(t, s, l, reg)
	for _, w := range []string{
		"edge.temperature:0|g",
		"edge.temperature:-5|g",
		"edge.events_total.a_b_c:7|c", // an empty label is no label
		"edge.latency_seconds.0_5:2|g",
		"edge.latency_seconds_count:1|c",
		"edge.latency_seconds_sum:2|c",
	} {
		if !slices.Contains(lines, w) {
			t.Errorf("lacks %q:\n%s", w, strings.Join(lines, "\n"))
		}
	}
	if i, j := slices.Index(lines, "edge.temperature:0|g"), slices.Index(lines, "edge.temperature:-5|g"); i > j {
		t.Errorf("the 0 comes after the negative value")
	}

	c.Reset()
	c.WithLabelValues("a.b|c", "").Add(2) // below the 7 last sent: a new series
	lines = flush(t, s, l, reg)
	if !slices.Contains(lines, "edge.events_total.a_b_c:2|c") {
		t.Errorf("after a reset, lacks the new count 2:\n%s", strings.Join(lines, "\n"))
	}

	nanReg := prometheus.NewRegistry()
	nanGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nan"}, func() float64 { return -0 / zero() })
	nanReg.MustRegister(nanGauge)
	nl := listen(t)
	ns := newSink(t, nl.addr(), nanReg, statsd.Options{})
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, nanReg, "sluice_statsd_errors_total", "reason", "nonfinite"); n != 1 {
		t.Errorf("nonfinite drops counted: %v, want 1", n)
	}
}

func zero() float64 { return 0 }

// TestSinkPacking: many series go in several datagrams, each at most MaxPacket bytes, with
// every line whole; a line longer than a datagram is dropped and counted, not sent cut.
func TestSinkPacking(t *testing.T) {
	t.Parallel()
	l := listen(t)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"route"})
	reg.MustRegister(c)
	const series = 300
	for i := range series {
		c.WithLabelValues("/api/v1/items/" + strings.Repeat("x", i%40) + "/" + string(rune('a'+i%26)) + "/" + time.Duration(i).String()).Inc()
	}
	c.WithLabelValues(strings.Repeat("y", statsd.MaxPacket)).Inc()
	s := newSink(t, l.addr(), reg, statsd.Options{})
	lines := flush(t, s, l, reg)
	n := 0
	for _, line := range lines {
		if strings.HasPrefix(line, "requests_total:1|c|#route:/api/v1/items/") {
			n++
		} else if strings.HasPrefix(line, "requests_total") {
			t.Errorf("line %q", line)
		}
	}
	if n != series {
		t.Errorf("%d series arrived whole, want %d", n, series)
	}
	if p := counter(t, reg, "sluice_statsd_packets_total"); p < 2 {
		t.Errorf("%v datagrams, want several", p)
	}
	if e := counter(t, reg, "sluice_statsd_errors_total", "reason", "oversize"); e != 1 {
		t.Errorf("oversize drops counted: %v, want 1", e)
	}
}

// TestSinkSendErrors: a StatsD server that is down costs counted errors, never a failure of
// the caller; when it is back, the sink dials again and delivers.
func TestSinkSendErrors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "hits_total"})
	reg.MustRegister(c)
	l := listen(t)
	addr := l.addr()
	s := newSink(t, addr, reg, statsd.Options{})
	c.Inc()
	flush(t, s, l, reg)
	l.conn.Close()

	// Linux reports the port unreachable (ICMP) on the socket: the write after it fails.
	var err error
	for range 3 {
		c.Inc()
		if err = s.Flush(); err != nil {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "statsd send") {
		t.Fatalf("no send error while the server is down: %v", err)
	}
	if n := counter(t, reg, "sluice_statsd_errors_total", "reason", "send"); n < 1 {
		t.Fatalf("send errors counted: %v", n)
	}

	back, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Skipf("the port could not be taken again to show recovery: %v", err)
	}
	l2 := &listener{t: t, conn: back}
	t.Cleanup(func() { back.Close() })
	c.Inc()
	lines := flush(t, s, l2, reg)
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "hits_total:") }) {
		t.Fatalf("after recovery: %q", lines)
	}
}

// TestSinkStartClose: Start sends from its own goroutine; Close sends what changed since the
// last send, so a shutdown loses nothing, and can be called twice.
func TestSinkStartClose(t *testing.T) {
	t.Parallel()
	l := listen(t)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "hits_total"})
	reg.MustRegister(c)
	s, err := statsd.New(l.addr(), reg, statsd.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	s.Start()
	for range 5 {
		c.Inc() // as requests do while the sink runs
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := l.read(1)[0]
	if !strings.Contains(got, "hits_total:5|c") {
		t.Fatalf("on close: %q", got)
	}
}

// TestNewRefusesBadOptions: the address and prefix are checked at once, naming what is wrong.
func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	tests := []struct {
		name, addr string
		o          statsd.Options
		err        string
	}{
		{name: "no port", addr: "localhost", err: "statsd address"},
		{name: "port 0", addr: "localhost:0", err: "port from 1 to 65535"},
		{name: "port not a number", addr: "localhost:statsd", err: "port from 1 to 65535"},
		{name: "no host", addr: ":8125", err: "host:port"},
		{name: "negative interval", addr: "localhost:8125", o: statsd.Options{Interval: -time.Second}, err: "interval"},
		{name: "prefix with a colon", addr: "localhost:8125", o: statsd.Options{Prefix: "a:b"}, err: "prefix"},
		{name: "unknown tags", addr: "localhost:8125", o: statsd.Options{Tags: 7}, err: "tags"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := statsd.New(tc.addr, reg, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one naming %q", err, tc.err)
			}
		})
	}
}

// TestEnvoyNames: with EnvoyPolicy, the hits of RLS requests are also counted under the
// reference service's names (ratelimit.service.rate_limit.DOMAIN.KEY.*), for named and unnamed
// limits, as the reference counts them (src/limiter/base_limiter.go): total_hits counts
// hits_addend, near_limit the hits past 0.8 of the limit, over_limit those past the limit.
func TestEnvoyNames(t *testing.T) {
	t.Parallel()
	cfg, err := envoyconf.Load(map[string][]byte{"edge.yaml": []byte(`
domain: edge
descriptors:
  - key: client_id
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /export
    rate_limit: {name: export, unit: hour, requests_per_unit: 1}
  - key: bulk
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    descriptors:
      - key: quota
        value: daily
        shadow_mode: true
        rate_limit: {unit: day, requests_per_unit: 1}
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {name: by-route, unit: minute, requests_per_unit: 10}
`)}, false)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := policy.Compile(&policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(memory.New(memory.WithSweepInterval(0)), empty.WithEnvoy(cfg, "v1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	m.EnableEnvoyValueStats()
	srv := rls.New(lim, m, rls.Options{})
	askHits := func(hits uint32, kv ...string) {
		d := &commonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		if _, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*commonv3.RateLimitDescriptor{d}}); err != nil {
			t.Fatal(err)
		}
	}
	ask := func(kv ...string) { askHits(0, kv...) }
	for range 3 {
		ask("client_id", "c1") // 2 within, 1 over
	}
	ask("path", "/export")
	ask("tenant", "t1", "quota", "daily")
	ask("tenant", "t1", "quota", "daily") // over, in shadow mode
	// 3 hits at a time against 10: 0→3, 3→6, 6→9 within (1 hit past the near threshold of 8),
	// then 9→12 over: 2 hits over the limit, 1 between 8 and 10 near (max(8, 9) to 10).
	for range 4 {
		askHits(3, "bulk", "b1")
	}
	ask("api_key", "k1")
	ask("api_key", "k1")
	ask("api_key", "k2|x") // a value StatsD cannot carry in a name
	ask("route", "r1", "method", "GET")

	l := listen(t)
	s := newSink(t, l.addr(), reg, statsd.Options{EnvoyPolicy: lim.Policy, EnvoyValues: m.DrainEnvoyValueStats})
	var got []string
	for _, line := range flush(t, s, l, reg) {
		if strings.HasPrefix(line, "ratelimit.") {
			got = append(got, line)
		}
	}
	slices.Sort(got)
	want := []string{
		// Limit 2, near threshold floor(1.6) = 1: the 2nd hit is near, the 3rd over.
		"ratelimit.service.rate_limit.edge.client_id.near_limit:1|c",
		"ratelimit.service.rate_limit.edge.client_id.over_limit:1|c",
		"ratelimit.service.rate_limit.edge.client_id.total_hits:3|c",
		"ratelimit.service.rate_limit.edge.client_id.within_limit:2|c",
		"ratelimit.service.rate_limit.edge.bulk.near_limit:2|c",
		"ratelimit.service.rate_limit.edge.bulk.over_limit:2|c",
		"ratelimit.service.rate_limit.edge.bulk.total_hits:12|c",
		"ratelimit.service.rate_limit.edge.bulk.within_limit:9|c",
		// Limit 1, near threshold 0: the one hit within is near too.
		"ratelimit.service.rate_limit.edge.path_/export.near_limit:1|c",
		"ratelimit.service.rate_limit.edge.path_/export.total_hits:1|c",
		"ratelimit.service.rate_limit.edge.path_/export.within_limit:1|c",
		"ratelimit.service.rate_limit.edge.tenant.quota_daily.near_limit:1|c",
		"ratelimit.service.rate_limit.edge.tenant.quota_daily.over_limit:1|c",
		"ratelimit.service.rate_limit.edge.tenant.quota_daily.shadow_mode:1|c",
		"ratelimit.service.rate_limit.edge.tenant.quota_daily.total_hits:2|c",
		"ratelimit.service.rate_limit.edge.tenant.quota_daily.within_limit:1|c",
		// detailed_metric and value_to_metric: per request value, never under the plain key.
		"ratelimit.service.rate_limit.edge.api_key_k1.total_hits:2|c",
		"ratelimit.service.rate_limit.edge.api_key_k1.within_limit:2|c",
		"ratelimit.service.rate_limit.edge.api_key_k2_x.total_hits:1|c",
		"ratelimit.service.rate_limit.edge.api_key_k2_x.within_limit:1|c",
		"ratelimit.service.rate_limit.edge.route_r1.method.total_hits:1|c",
		"ratelimit.service.rate_limit.edge.route_r1.method.within_limit:1|c",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
