// Package statsd sends Sluice's Prometheus metrics to a StatsD server over UDP, under the same
// names, for platforms that collect StatsD (Datadog, Telegraf, statsd_exporter, Envoy-style
// stacks) beside or instead of scraping /metrics.
//
// # Mapping
//
// A Sink gathers a prometheus.Gatherer every Interval, off the request path, and sends what
// changed:
//
//   - counter: the increase since the last send, as a StatsD counter (|c). A series that went
//     down (it was deleted and made again) counts from zero. Increases of 0 are not sent.
//   - gauge, untyped: the value, as a StatsD gauge (|g), every time. A negative value is sent
//     as 0 then the value, as StatsD reads a leading '-' as a decrement otherwise.
//   - histogram: NAME_bucket with an le tag (cumulative, as in Prometheus), NAME_count and
//     NAME_sum, each as a counter of its increase. StatsD timers are not used: the histogram
//     holds bucket counts, not the observations a timer wants, and the buckets let a
//     dashboard compute the same quantiles it does from Prometheus.
//   - summary: each quantile as a gauge with a quantile tag, NAME_count and NAME_sum as
//     counters.
//
// Labels become DogStatsD tags by default (sluice_checks_total:3|c|#api:http,rule:per-caller,...):
// the metric keeps exactly the name /metrics gives it, every label stays a dimension that can
// be filtered and grouped, and label values (rule names such as "edge/client_id", versions)
// need no escaping into a dotted hierarchy. The Datadog agent, statsd_exporter, Vector,
// gostatsd and Telegraf (with datadog_extensions) read them. For a server that reads plain
// StatsD only, TagsInName puts the label values into the name instead, in the order of the
// label names (api, mode, result, rule, state:
// sluice_checks_total.http.normal.allowed.per-caller.normal), with every character but
// letters, digits, '_' and '-' made '_'; empty values are left out.
//
// # Envoy's names
//
// With Options.EnvoyPolicy, the hits of Envoy's API under each limit
// (sluice_envoy_stats_total{rule,stat}, counted as the reference counts them: hits_addend,
// near_limit past 0.8 of the limit) are also sent under the names Envoy's reference service
// gives them, so that dashboards and alerts made for it keep working:
// ratelimit.service.rate_limit.DOMAIN.KEY.{total_hits, within_limit, near_limit, over_limit,
// shadow_mode}, KEY being the descriptor path as the reference writes it (key_value.key2).
// A limit named per request value (detailed_metric, value_to_metric) is sent under each
// request's name instead, from Options.EnvoyValues, as the reference sends it: those names are
// unbounded, so Prometheus has them only summed per limit and the metrics keep at most
// metrics.MaxEnvoyValueKeys between two sends. over_limit_with_local_cache (no such cache) has
// no counterpart.
//
// # Transport
//
// Lines are packed into datagrams of at most MaxPacket bytes (1432: a 1500-byte Ethernet MTU
// less IP and UDP headers, so no datagram is fragmented). A send that fails is counted
// (sluice_statsd_errors_total{reason="send"}) and the socket dialled again, resolving the
// host again, at the next send; no error stops the sink or reaches a request.
//
// The UDP writer is written here, not taken from a client library: what a Sink needs of one
// is a connected socket and packing lines into datagrams, a few lines, while the part that
// matters (reading a Gatherer and turning cumulative series into StatsD's deltas) is in no
// client. cactus/go-statsd-client's buffered sender flushes on a goroutine and timer of its
// own and drops the write error there, so failures could not be counted; DataDog's datadog-go
// speaks DogStatsD only and adds its own aggregation, workers and telemetry metrics on top of
// what Prometheus has already aggregated.
package statsd

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
)

// MaxPacket is the largest datagram a Sink sends.
const MaxPacket = 1432

// DefaultInterval is how often a Sink sends when Options.Interval is 0: StatsD's own flush
// interval, so each of its flushes sees one send.
const DefaultInterval = 10 * time.Second

// Tags says how labels are written.
type Tags int

const (
	// TagsDogStatsD writes labels as DogStatsD tags: |#key:value,key:value.
	TagsDogStatsD Tags = iota
	// TagsInName appends the label values to the name: NAME.value.value.
	TagsInName
)

// Options configure a Sink. The zero value sends every 10 s with DogStatsD tags.
type Options struct {
	// Interval between sends; DefaultInterval when 0.
	Interval time.Duration
	// Prefix, when set, is put before every name with a dot: PREFIX.sluice_checks_total.
	Prefix string
	// Tags chooses how labels are written.
	Tags Tags
	// EnvoyPolicy, when set, returns the policy in force (pass Limiter.Policy): its Envoy
	// limits name the reference service's per-limit counters, sent beside Sluice's own.
	EnvoyPolicy func() *policy.Snapshot
	// EnvoyValues, when set with EnvoyPolicy, hands over the hits of the limits whose stats
	// the reference names per request value (detailed_metric, value_to_metric) under those
	// names (pass Metrics.DrainEnvoyValueStats); such limits are then sent under them only,
	// as the reference sends them.
	EnvoyValues func(func(key string, h metrics.EnvoyHits))
	// Registerer, when set, gets the sink's own counters: sluice_statsd_packets_total and
	// sluice_statsd_errors_total{reason} (send, dial, gather, oversize, nonfinite).
	Registerer prometheus.Registerer
	// Log is told of the first failure of a run of failures and of the recovery; never per
	// packet. slog.Default() when nil.
	Log *slog.Logger
}

// Sink sends a Gatherer's metrics to one StatsD address. Create it with New, then Start it;
// Close sends a last time and stops it.
type Sink struct {
	addr   string
	g      prometheus.Gatherer
	o      Options
	log    *slog.Logger
	stop   chan struct{}
	done   chan struct{}
	start  sync.Once
	closed sync.Once

	packets prometheus.Counter
	errs    *prometheus.CounterVec

	mu      sync.Mutex // one send at a time; guards everything below
	conn    net.Conn
	failing bool
	last    map[string]float64 // counter series → value at the last send
	seen    map[string]bool    // series present in this send, to forget the others
	packet  []byte
	line    []byte
	envoy   envoyKeys
}

// New returns a Sink that sends g's metrics to addr (host:port). The address is checked now
// and dialled at the first send, so a StatsD server that is not up yet, or a name that does
// not resolve yet, only costs the sends until it is.
func New(addr string, g prometheus.Gatherer, o Options) (*Sink, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("statsd address %q: %w", addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 || host == "" {
		return nil, fmt.Errorf("statsd address %q: want host:port with a port from 1 to 65535", addr)
	}
	if o.Interval < 0 {
		return nil, fmt.Errorf("statsd interval %v: must not be negative", o.Interval)
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Tags != TagsDogStatsD && o.Tags != TagsInName {
		return nil, fmt.Errorf("statsd tags %d: unknown", o.Tags)
	}
	if i := strings.IndexAny(o.Prefix, ":|@#,\n\r\t "); i >= 0 {
		return nil, fmt.Errorf("statsd prefix %q: %q cannot be part of a StatsD name", o.Prefix, o.Prefix[i])
	}
	s := &Sink{
		addr: addr, g: g, o: o, log: o.Log,
		stop: make(chan struct{}), done: make(chan struct{}),
		packets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_statsd_packets_total",
			Help: "Datagrams sent to the StatsD server.",
		}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_statsd_errors_total",
			Help: "StatsD export failures by reason: send, dial, gather, oversize (a line longer than a datagram, dropped), nonfinite (NaN or infinite value, dropped).",
		}, []string{"reason"}),
		last:   map[string]float64{},
		seen:   map[string]bool{},
		packet: make([]byte, 0, MaxPacket),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(s.packets); err != nil {
			return nil, fmt.Errorf("register statsd metrics: %w", err)
		}
		if err := o.Registerer.Register(s.errs); err != nil {
			o.Registerer.Unregister(s.packets)
			return nil, fmt.Errorf("register statsd metrics: %w", err)
		}
	}
	return s, nil
}

// Start sends every Interval from a goroutine of its own until Close. Calls after the first
// do nothing.
func (s *Sink) Start() {
	s.start.Do(func() {
		go func() {
			defer close(s.done)
			t := time.NewTicker(s.o.Interval)
			defer t.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-t.C:
					s.Flush()
				}
			}
		}()
	})
}

// Close stops the sends, sends once more (what changed since the last send, so a shutdown
// loses nothing) and closes the socket. It is safe to call more than once.
func (s *Sink) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.stop)
		started := true
		s.start.Do(func() { started = false }) // a Sink never started has no goroutine to wait for
		if started {
			<-s.done
		}
		s.Flush()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.conn != nil {
			err = s.conn.Close()
			s.conn = nil
		}
	})
	return err
}

// Flush gathers and sends now. Start calls it every Interval; it returns the first error of
// this send, which is also counted and logged.
func (s *Sink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	mfs, gerr := s.g.Gather()
	if gerr != nil {
		// A Gatherer returns what it could gather beside the error: send that.
		s.errs.WithLabelValues("gather").Inc()
	}
	clear(s.seen)
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if s.o.EnvoyPolicy != nil {
		s.envoy.refresh(s.o.EnvoyPolicy())
	}
	for _, mf := range mfs {
		note(s.family(mf))
	}
	if s.o.EnvoyValues != nil && s.envoy.keys != nil {
		s.o.EnvoyValues(func(key string, h metrics.EnvoyHits) {
			for _, st := range [...]struct {
				name string
				n    uint64
			}{{"total_hits", h.Total}, {"within_limit", h.Within}, {"near_limit", h.Near}, {"over_limit", h.Over}, {"shadow_mode", h.Shadow}} {
				if st.n > 0 {
					note(s.envoyLine(key, st.name, float64(st.n)))
				}
			}
		})
	}
	note(s.send())
	for k := range s.last {
		if !s.seen[k] {
			delete(s.last, k) // the series is gone (a policy version replaced, say)
		}
	}
	if firstErr == nil {
		firstErr = gerr
	}
	s.report(firstErr)
	return firstErr
}

// report logs the first failure after a success and the first success after a failure.
func (s *Sink) report(err error) {
	switch {
	case err != nil && !s.failing:
		s.failing = true
		s.log.Warn("statsd export failing; counting failures in sluice_statsd_errors_total", "addr", s.addr, "err", err)
	case err == nil && s.failing:
		s.failing = false
		s.log.Info("statsd export recovered", "addr", s.addr)
	}
}

// family writes the lines of one metric family.
func (s *Sink) family(mf *dto.MetricFamily) error {
	name := sanitizeName(mf.GetName())
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, m := range mf.GetMetric() {
		labels := m.GetLabel()
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			delta := s.delta(name, labels, "", "", m.GetCounter().GetValue())
			note(s.emit(name, labels, "", "", delta, 'c'))
			if mf.GetName() == "sluice_envoy_stats_total" {
				note(s.envoyCounts(labels, delta))
			}
		case dto.MetricType_GAUGE:
			note(s.gauge(name, labels, "", "", m.GetGauge().GetValue()))
		case dto.MetricType_UNTYPED:
			note(s.gauge(name, labels, "", "", m.GetUntyped().GetValue()))
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			h := m.GetHistogram()
			bucket := name + "_bucket"
			for _, b := range h.GetBucket() {
				le := formatFloat(b.GetUpperBound())
				note(s.emit(bucket, labels, "le", le, s.delta(bucket, labels, "le", le, float64(b.GetCumulativeCount())), 'c'))
			}
			// The +Inf bucket is implicit in the protobuf form: it is the count.
			note(s.emit(bucket, labels, "le", "+Inf", s.delta(bucket, labels, "le", "+Inf", float64(h.GetSampleCount())), 'c'))
			note(s.emit(name+"_count", labels, "", "", s.delta(name+"_count", labels, "", "", float64(h.GetSampleCount())), 'c'))
			note(s.emit(name+"_sum", labels, "", "", s.delta(name+"_sum", labels, "", "", h.GetSampleSum()), 'c'))
		case dto.MetricType_SUMMARY:
			sm := m.GetSummary()
			for _, q := range sm.GetQuantile() {
				note(s.gauge(name, labels, "quantile", formatFloat(q.GetQuantile()), q.GetValue()))
			}
			note(s.emit(name+"_count", labels, "", "", s.delta(name+"_count", labels, "", "", float64(sm.GetSampleCount())), 'c'))
			note(s.emit(name+"_sum", labels, "", "", s.delta(name+"_sum", labels, "", "", sm.GetSampleSum()), 'c'))
		}
	}
	return firstErr
}

// delta returns the increase of a cumulative series since the last send and remembers v.
func (s *Sink) delta(name string, labels []*dto.LabelPair, extraName, extraValue string, v float64) float64 {
	k := seriesKey(name, labels, extraName, extraValue)
	s.seen[k] = true
	prev, ok := s.last[k]
	s.last[k] = v
	switch {
	case !ok:
		// First sight: the series counts from the start of the process (or its creation).
		return v
	case v < prev:
		// Reset: the series was deleted and made again since.
		return v
	}
	return v - prev
}

// gauge writes a gauge line, as 0 then the value when it is negative.
func (s *Sink) gauge(name string, labels []*dto.LabelPair, extraName, extraValue string, v float64) error {
	if v < 0 {
		if err := s.emit(name, labels, extraName, extraValue, 0, 'g'); err != nil {
			return err
		}
	}
	return s.emit(name, labels, extraName, extraValue, v, 'g')
}

// emit writes one line; counters with no increase are skipped.
func (s *Sink) emit(name string, labels []*dto.LabelPair, extraName, extraValue string, v float64, kind byte) error {
	if kind == 'c' && v == 0 {
		return nil
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		s.errs.WithLabelValues("nonfinite").Inc()
		return nil
	}
	b := s.line[:0]
	if s.o.Prefix != "" {
		b = append(b, s.o.Prefix...)
		b = append(b, '.')
	}
	b = append(b, name...)
	if s.o.Tags == TagsInName {
		for _, l := range labels {
			if l.GetValue() != "" {
				b = append(b, '.')
				b = appendNamePart(b, l.GetValue())
			}
		}
		if extraName != "" {
			b = append(b, '.')
			b = appendNamePart(b, extraValue)
		}
	}
	b = append(b, ':')
	b = strconv.AppendFloat(b, v, 'f', -1, 64)
	b = append(b, '|', kind)
	if s.o.Tags == TagsDogStatsD {
		first := true
		tag := func(k, v string) {
			if v == "" {
				return // Prometheus reads an empty label as no label
			}
			if first {
				b = append(b, '|', '#')
				first = false
			} else {
				b = append(b, ',')
			}
			b = append(b, k...)
			b = append(b, ':')
			b = appendTagValue(b, v)
		}
		for _, l := range labels {
			tag(l.GetName(), l.GetValue())
		}
		if extraName != "" {
			tag(extraName, extraValue)
		}
	}
	s.line = b
	return s.write(b)
}

// write adds one line to the datagram being filled, sending it first when the line would not
// fit. A line longer than a datagram is dropped and counted.
func (s *Sink) write(line []byte) error {
	if len(line) > MaxPacket {
		s.errs.WithLabelValues("oversize").Inc()
		return nil
	}
	var err error
	if len(s.packet) > 0 && len(s.packet)+1+len(line) > MaxPacket {
		err = s.send()
	}
	if len(s.packet) > 0 {
		s.packet = append(s.packet, '\n')
	}
	s.packet = append(s.packet, line...)
	return err
}

// send sends the datagram being filled, dialling first when there is no socket.
func (s *Sink) send() error {
	if len(s.packet) == 0 {
		return nil
	}
	defer func() { s.packet = s.packet[:0] }()
	if s.conn == nil {
		conn, err := net.DialTimeout("udp", s.addr, time.Second)
		if err != nil {
			s.errs.WithLabelValues("dial").Inc()
			return fmt.Errorf("statsd dial %s: %w", s.addr, err)
		}
		s.conn = conn
	}
	// A write to UDP does not wait for the peer; the deadline covers a full socket buffer.
	s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := s.conn.Write(s.packet); err != nil {
		s.errs.WithLabelValues("send").Inc()
		// Dial again next time: the address may have moved (a new pod behind the name), and a
		// connected UDP socket keeps reporting the refusal an ICMP error left on it.
		s.conn.Close()
		s.conn = nil
		return fmt.Errorf("statsd send to %s: %w", s.addr, err)
	}
	s.packets.Inc()
	return nil
}

// seriesKey identifies a series across sends.
func seriesKey(name string, labels []*dto.LabelPair, extraName, extraValue string) string {
	var b strings.Builder
	b.WriteString(name)
	for _, l := range labels {
		b.WriteByte(0)
		b.WriteString(l.GetName())
		b.WriteByte(0)
		b.WriteString(l.GetValue())
	}
	if extraName != "" {
		b.WriteByte(0)
		b.WriteString(extraName)
		b.WriteByte(0)
		b.WriteString(extraValue)
	}
	return b.String()
}

// sanitizeName makes a Prometheus name a StatsD name: ':' (legal in Prometheus, the
// name/value separator in StatsD) becomes '_'.
func sanitizeName(name string) string { return strings.ReplaceAll(name, ":", "_") }

// appendTagValue appends v with the bytes that end a tag, a field or a line in DogStatsD
// (',', '|', newlines) made '_'.
func appendTagValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch c {
		case ',', '|', '\n', '\r':
			c = '_'
		}
		b = append(b, c)
	}
	return b
}

// appendNamePart appends v as one level of a dotted name: letters, digits, '_' and '-' kept,
// everything else '_'.
func appendNamePart(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			c = '_'
		}
		b = append(b, c)
	}
	return b
}

// formatFloat writes a bucket bound or quantile as Prometheus does.
func formatFloat(f float64) string {
	if math.IsInf(f, +1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// envoyKeys maps sluice_checks_total's rule label of an Envoy limit to the reference
// service's stat key (DOMAIN.key_value.key2), rebuilt when the policy version changes.
type envoyKeys struct {
	version string
	keys    map[string]string
	// perValue holds the rule labels of the limits named per request value: their counts
	// come from Options.EnvoyValues.
	perValue map[string]bool
}

func (e *envoyKeys) refresh(snap *policy.Snapshot) {
	if snap == nil {
		e.version, e.keys = "", nil
		return
	}
	if snap.Version == e.version && e.keys != nil {
		return
	}
	e.version, e.keys, e.perValue = snap.Version, map[string]string{}, map[string]bool{}
	cfg := snap.Envoy()
	if cfg == nil {
		return
	}
	for _, domain := range cfg.Domains() {
		for _, l := range cfg.Limits(domain) {
			k := l.StatKey
			// The metrics name a limit by its name when it has one, else by domain/ID.
			e.keys[domain+"/"+l.ID] = k
			if _, taken := e.keys[l.Name]; l.Name != "" && !taken {
				e.keys[l.Name] = k
			}
			if l.PerValueStats() {
				e.perValue[domain+"/"+l.ID] = true
				if l.Name != "" {
					e.perValue[l.Name] = true
				}
			}
		}
	}
}

// envoyCounts adds a count of sluice_envoy_stats_total to the reference service's name of its
// stat: ratelimit.service.rate_limit.KEY.STAT.
func (s *Sink) envoyCounts(labels []*dto.LabelPair, delta float64) error {
	if s.envoy.keys == nil || delta == 0 {
		return nil
	}
	var rule, stat string
	for _, l := range labels {
		switch l.GetName() {
		case "rule":
			rule = l.GetValue()
		case "stat":
			stat = l.GetValue()
		}
	}
	key, ok := s.envoy.keys[rule]
	if !ok || stat == "" || (s.o.EnvoyValues != nil && s.envoy.perValue[rule]) {
		return nil
	}
	return s.envoyLine(key, stat, delta)
}

// envoyLine sends delta as the reference service's counter KEY.STAT.
func (s *Sink) envoyLine(key, stat string, delta float64) error {
	b := s.line[:0]
	if s.o.Prefix != "" {
		b = append(b, s.o.Prefix...)
		b = append(b, '.')
	}
	b = append(b, "ratelimit.service.rate_limit."...)
	b = appendEnvoyKey(b, key)
	b = append(b, '.')
	b = append(b, stat...)
	b = append(b, ':')
	b = strconv.AppendFloat(b, delta, 'f', -1, 64)
	b = append(b, '|', 'c')
	s.line = b
	return s.write(b)
}

// appendEnvoyKey appends a stat key with the bytes StatsD cannot carry in a name (':', '|',
// '@', '#', white space) made '_'; dots stay, as they are the reference's hierarchy.
func appendEnvoyKey(b []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch c {
		case ':', '|', '@', '#', ' ', '\t', '\n', '\r', ',':
			c = '_'
		}
		b = append(b, c)
	}
	return b
}
