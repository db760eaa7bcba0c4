// Package metrics exports Sluice's Prometheus metrics: checks by API, rule, result, state and
// mode; check latency; store errors; policy reloads and version. A nil *Metrics records
// nothing, so code can call it unconditionally.
package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Metrics holds the collectors. Create it with New.
type Metrics struct {
	checks      *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	reloads     *prometheus.CounterVec
	policyInfo  *prometheus.GaugeVec
	rejected    *prometheus.CounterVec
	breaker     *prometheus.GaugeVec
	anonymous   *prometheus.CounterVec
	controlUp   prometheus.Gauge
	leases      *prometheus.CounterVec
	leaseUnits  *prometheus.CounterVec
	slots       *prometheus.CounterVec
	lastVersion atomic.Pointer[string]
	counters    atomic.Pointer[map[checkKey]prometheus.Counter]
	envoyStats  *prometheus.CounterVec
	envoyByRule atomic.Pointer[map[string]*envoyCounters]
	envoyValues envoyValueStats
	// envoyOverflow counts the hits of per-value stats keys past MaxEnvoyValueKeys.
	envoyOverflow prometheus.Counter
	durations     atomic.Pointer[map[string]prometheus.Observer]
	mu            sync.Mutex // serialises copy-on-write of the caches
	storeErrName  string
	reg           prometheus.Registerer
}

// checkKey is one label set of sluice_checks_total.
type checkKey struct {
	api, rule, result, state, mode string
}

// New registers Sluice's collectors with reg.
func New(reg prometheus.Registerer, storeName string) *Metrics {
	m := &Metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_checks_total",
			Help: "Rate-limit decisions by API (http, grpc, rls), deciding rule, result (allowed, denied, exempt), state (normal, soft, hard) and mode (normal, shadow, fallback, hot_key).",
		}, []string{"api", "rule", "result", "state", "mode"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_check_duration_seconds",
			Help:    "Time to decide a check inside Sluice, by API.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}, []string{"api"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store calls that failed, by store.",
		}, []string{"store"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_policy_reloads_total",
			Help: "Policy reloads by result (ok, error).",
		}, []string{"result"}),
		policyInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_policy_info",
			Help: "1 for the policy version in force.",
		}, []string{"version"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_rejected_total",
			Help: "Requests refused before deciding, by API and reason (invalid, idempotency_mismatch, overloaded).",
		}, []string{"api", "reason"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_store_breaker_state",
			Help: "The store's circuit breaker: 0 closed, 1 half-open, 2 open (checks follow on_store_error).",
		}, []string{"store"}),
		anonymous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_without_identity_total",
			Help: "Checks by API where a limit keys on an identity attribute (identity, user, api_key, ip) the request lacks: such requests share one bucket per limit.",
		}, []string{"api"}),
		controlUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_control_store_up",
			Help: "1 when the control store answers, 0 while it does not (the node enforces the last policy it compiled).",
		}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_leases_total",
			Help: "Reservations' leases by event: reserved, settled (a first commit or release; repeats are not counted). Leases in flight on this node's API are reserved minus settled, less those that expired.",
		}, []string{"event"}),
		slots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_concurrency_slots_total",
			Help: "Concurrency slots on this node's API by event: taken (by a reservation), freed (by its first settlement), refused (a reservation a concurrency limit denied). Slots in flight are taken minus freed, less those whose lease expired unsettled; /v1/quota shows a key's in_flight fleet-wide.",
		}, []string{"event"}),
		leaseUnits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lease_units_total",
			Help: "Units settled leases adjusted, by direction: returned (reserved but not used, given back) and excess (used past the reservation, taken past the limit).",
		}, []string{"direction"}),
		storeErrName: storeName,
		reg:          reg,
	}
	m.envoyStats = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_envoy_stats_total",
		Help: "Hits of RLS requests under each Envoy-format limit (rule), counted as Envoy's reference service counts its stats (stat: total_hits, within_limit, near_limit, over_limit, shadow_mode).",
	}, []string{"rule", "stat"})
	m.envoyOverflow = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_envoy_value_stats_overflow_total",
		Help: "Hits of detailed_metric and value_to_metric limits counted under the limit's own stats key because more distinct per-value keys than the bound were seen between two StatsD sends.",
	})
	reg.MustRegister(m.checks, m.duration, m.storeErrors, m.reloads, m.policyInfo, m.rejected, m.breaker, m.anonymous, m.controlUp, m.envoyStats, m.envoyOverflow, m.leases, m.leaseUnits, m.slots)
	byRule := map[string]*envoyCounters{}
	m.envoyByRule.Store(&byRule)
	empty := map[checkKey]prometheus.Counter{}
	m.counters.Store(&empty)
	durations := map[string]prometheus.Observer{}
	m.durations.Store(&durations)
	return m
}

// ObserveCheck records a native decision (HTTP or gRPC).
func (m *Metrics) ObserveCheck(api string, d *sluice.Decision, elapsed time.Duration) {
	if m == nil {
		return
	}
	result, mode := "allowed", "normal"
	switch {
	case d.Exempt:
		result = "exempt"
	case !d.Allowed:
		result = "denied"
	}
	switch {
	case d.Degraded:
		mode = "fallback"
	case d.HotKey:
		mode = "hot_key"
	case d.Shadow:
		mode = "shadow"
	}
	m.counter(checkKey{api, d.Rule, result, d.State.String(), mode}).Inc()
	m.observer(api).Observe(elapsed.Seconds())
	if d.Anonymous {
		m.anonymous.WithLabelValues(api).Inc()
	}
}

// ObserveDescriptors records an Envoy RLS decision: one count per descriptor that had a limit,
// labelled with the limit's name (or its id when unnamed).
// A limit whose stats are named per request value (envoyconf.Limit.PerValueStats) is also
// counted under the request's name for the StatsD sink (DrainEnvoyValueStats).
func (m *Metrics) ObserveDescriptors(api string, req *sluice.DescriptorRequest, d *sluice.DescriptorDecision, elapsed time.Duration) {
	if m == nil {
		return
	}
	mode := "normal"
	if d.Degraded {
		mode = "fallback"
	}
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if !st.HasLimit {
			continue
		}
		rule := st.Name
		if rule == "" && st.Limit != nil {
			rule = st.Limit.Label()
		}
		result, state, stMode := "allowed", "normal", mode
		if !st.OK {
			result, state = "denied", "hard"
		}
		if st.Shadow {
			state, stMode = "hard", "shadow"
		}
		m.counter(checkKey{api, rule, result, state, stMode}).Inc()
		if st.Limit != nil && st.Hits > 0 {
			h := envoyHits(st, d.OK && st.OK && !st.Shadow)
			m.envoyCounters(rule).add(h)
			if st.Limit.PerValueStats() && i < len(req.Descriptors) {
				m.countPerValue(st.Limit, req.Descriptors[i].Entries, h)
			}
		}
	}
	m.observer(api).Observe(elapsed.Seconds())
}

// StoreError counts a failed store call.
func (m *Metrics) StoreError(error) {
	if m != nil {
		m.storeErrors.WithLabelValues(m.storeErrName).Inc()
	}
}

// BreakerState records the store's circuit breaker state: closed, half-open or open.
func (m *Metrics) BreakerState(state string) {
	if m == nil {
		return
	}
	v := map[string]float64{"closed": 0, "half-open": 1, "open": 2}[state]
	m.breaker.WithLabelValues(m.storeErrName).Set(v)
}

// ControlStoreUp records whether the control store answers.
func (m *Metrics) ControlStoreUp(up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.controlUp.Set(v)
}

// HotKeyStats are hot-key mode's figures (store/hotkey).
type HotKeyStats struct {
	Hot                 int
	Local, Mixed, Syncs int64
}

// WatchHotKeys exports hot-key mode's figures, read from stats when scraped: the keys now hot,
// the requests decided in the process, those decided in part (hot limits in the process, the
// others by the store), and the sync calls made to the store.
func (m *Metrics) WatchHotKeys(stats func() HotKeyStats) {
	if m == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_hot_keys", Help: "Keys this node decides locally (hot-key mode), less those retiring."},
			func() float64 { return float64(stats().Hot) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_hot_key_local_decisions_total", Help: "Requests decided in the process on hot keys."},
			func() float64 { return float64(stats().Local) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_hot_key_mixed_decisions_total", Help: "Requests whose limits on hot keys were decided in the process and the others by the store."},
			func() float64 { return float64(stats().Mixed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_hot_key_syncs_total", Help: "Store calls made to write hot keys' hits back."},
			func() float64 { return float64(stats().Syncs) }),
	)
}

// AllowanceStats are node allowances' figures (store/allowance.Stats).
type AllowanceStats struct {
	Local, Shared, Grants, GivenBack, Uncounted int64
}

// WatchAllowances exports node allowances' figures, read from stats when scraped: requests
// decided from the units the node holds and by the store, the grants taken, the give-backs of
// units left unspent, and the admissions counted short across a window's end.
func (m *Metrics) WatchAllowances(stats func() AllowanceStats) {
	if m == nil {
		return
	}
	decided := func(where string, v func(AllowanceStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_allowance_decisions_total",
			Help:        "Requests on fixed windows with node allowances, by where they were decided: node (from units it holds) or store.",
			ConstLabels: prometheus.Labels{"where": where}},
			func() float64 { return float64(v(stats())) })
	}
	m.reg.MustRegister(
		decided("node", func(s AllowanceStats) int64 { return s.Local }),
		decided("store", func(s AllowanceStats) int64 { return s.Shared }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_allowance_grants_total", Help: "Grants of a limit's units a node took beside a request."},
			func() float64 { return float64(stats().Grants) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_allowance_give_backs_total", Help: "Units a node held unspent and gave back to the store, counted by key."},
			func() float64 { return float64(stats().GivenBack) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_allowance_uncounted_total", Help: "Requests admitted across a window's end whose count in the new window could not be completed: that window stands low by at most their cost."},
			func() float64 { return float64(stats().Uncounted) }),
	)
}

// RedisStats are the Redis store's figures (store/redis.Stats), summed over its stores.
type RedisStats struct {
	ScriptCalls, ScriptBatches  uint64
	PlainDecided, PlainFellBack uint64
	Redirects                   uint64
	RoutedSlots                 int
}

// WatchRedis exports the Redis store's figures, read from stats when scraped: its script
// calls and the batches they decided, the batches plain commands decided and those that fell
// back to the script, and on a Cluster the plain flights a node redirected and the slots whose
// primary plain windows know.
func (m *Metrics) WatchRedis(stats func() RedisStats) {
	if m == nil {
		return
	}
	plain := func(outcome string, v func(RedisStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_redis_plain_batches_total",
			Help:        "Batches counted with plain commands (fixed windows far from their limits), by outcome: decided, or fell back to the script.",
			ConstLabels: prometheus.Labels{"outcome": outcome}},
			func() float64 { return float64(v(stats())) })
	}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_redis_script_calls_total", Help: "Script calls the Redis store made for coalesced requests."},
			func() float64 { return float64(stats().ScriptCalls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_redis_script_batches_total", Help: "Requests' batches those script calls decided."},
			func() float64 { return float64(stats().ScriptBatches) }),
		plain("decided", func(s RedisStats) uint64 { return s.PlainDecided }),
		plain("fell_back", func(s RedisStats) uint64 { return s.PlainFellBack }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_redis_cluster_redirects_total", Help: "Plain flights a Redis Cluster node refused (MOVED, ASK) for a slot it no longer served."},
			func() float64 { return float64(stats().Redirects) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_redis_cluster_routed_slots", Help: "Redis Cluster slots whose primary plain windows reach directly (16384 when all are)."},
			func() float64 { return float64(stats().RoutedSlots) }),
	)
}

// LeaseReserved counts a reservation's lease issued.
func (m *Metrics) LeaseReserved() {
	if m != nil {
		m.leases.WithLabelValues("reserved").Inc()
	}
}

// ObserveSlots counts the concurrency slots a reservation's decision d took or was refused.
func (m *Metrics) ObserveSlots(d *sluice.Decision) {
	if m == nil {
		return
	}
	for i := range d.Results {
		r := &d.Results[i]
		switch {
		case r.Algorithm != algorithm.Concurrency:
		case !r.Allowed:
			m.slots.WithLabelValues("refused").Inc()
		case d.Allowed:
			m.slots.WithLabelValues("taken").Inc()
		}
	}
}

// LeaseSettled counts a lease's first settlement, the units it gave back or took more, and
// the concurrency slots it freed.
func (m *Metrics) LeaseSettled(reserved, used int64, slots int) {
	if m == nil {
		return
	}
	m.leases.WithLabelValues("settled").Inc()
	if slots > 0 {
		m.slots.WithLabelValues("freed").Add(float64(slots))
	}
	switch {
	case used < reserved:
		m.leaseUnits.WithLabelValues("returned").Add(float64(reserved - used))
	case used > reserved:
		m.leaseUnits.WithLabelValues("excess").Add(float64(used - reserved))
	}
}

// Rejected counts a request refused before deciding.
func (m *Metrics) Rejected(api, reason string) {
	if m != nil {
		m.rejected.WithLabelValues(api, reason).Inc()
	}
}

// PolicyLoaded records a reload; on success version becomes the one in force.
func (m *Metrics) PolicyLoaded(version string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.reloads.WithLabelValues("error").Inc()
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
	if old := m.lastVersion.Swap(&version); old != nil && *old != version {
		m.policyInfo.DeleteLabelValues(*old)
	}
	m.policyInfo.WithLabelValues(version).Set(1)
}

// counter returns the counter of k, created on first use.
func (m *Metrics) counter(k checkKey) prometheus.Counter {
	return cached(&m.counters, &m.mu, k, func() prometheus.Counter {
		return m.checks.WithLabelValues(k.api, k.rule, k.result, k.state, k.mode)
	})
}

func (m *Metrics) observer(api string) prometheus.Observer {
	return cached(&m.durations, &m.mu, api, func() prometheus.Observer { return m.duration.WithLabelValues(api) })
}

// cached reads k from a copy-on-write map: the hot path reads an immutable map with no lock
// and no allocation (WithLabelValues would hash the labels and allocate); a new key copies the
// map once, under mu.
func cached[K comparable, V any](p *atomic.Pointer[map[K]V], mu *sync.Mutex, k K, create func() V) V {
	if v, ok := (*p.Load())[k]; ok {
		return v
	}
	mu.Lock()
	defer mu.Unlock()
	old := *p.Load()
	if v, ok := old[k]; ok {
		return v
	}
	v := create()
	next := make(map[K]V, len(old)+1)
	for kk, vv := range old {
		next[kk] = vv
	}
	next[k] = v
	p.Store(&next)
	return v
}
