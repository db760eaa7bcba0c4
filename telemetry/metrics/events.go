package metrics

import "github.com/prometheus/client_golang/prometheus"

// EventStats are the figures of the recorder that counts decisions for the violations log and
// usage history (telemetry/usage).
type EventStats struct {
	// Dropped are events refused by the full queue; Lost, counts gathered but never written.
	Dropped, Lost int64
	// Writes and WriteErrors count writes to the control store; Rows, the rows written.
	Writes, WriteErrors, Rows int64
	// Queued are the events waiting now.
	Queued int
}

// WatchEvents exports the decision-event recorder's figures, read from stats when scraped.
func (m *Metrics) WatchEvents(stats func() EventStats) {
	if m == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_events_dropped_total",
			Help: "Decision events dropped because the recorder's queue was full: decisions missing from the usage history and violations log (the decisions themselves were made as usual).",
		}, func() float64 { return float64(stats().Dropped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_events_lost_total",
			Help: "Decision counts gathered but never written to the control store: past the recorder's row cap while the store was down, or refused by it.",
		}, func() float64 { return float64(stats().Lost) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_events_writes_total",
			Help:        "Writes of decision counts to the control store, by result (ok, error).",
			ConstLabels: prometheus.Labels{"result": "ok"},
		}, func() float64 { s := stats(); return float64(s.Writes - s.WriteErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_events_writes_total",
			Help:        "Writes of decision counts to the control store, by result (ok, error).",
			ConstLabels: prometheus.Labels{"result": "error"},
		}, func() float64 { return float64(stats().WriteErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_events_rows_written_total",
			Help: "Rows of decision counts (per minute, rule and tenant or identity) upserted into the control store: this node's write load on it.",
		}, func() float64 { return float64(stats().Rows) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_events_queued",
			Help: "Decision events waiting in the recorder's queue.",
		}, func() float64 { return float64(stats().Queued) }),
	)
}

// TenantThrottle returns the setter of sluice_tenant_throttle_ratio{tenant}: the share of
// decisions that were denied or soft, every rule together, over the recorder's last flush, for
// the tenants with the most throttled decisions on this node (at most events.TopTenants, so
// the label stays bounded). Each call replaces the previous set.
func (m *Metrics) TenantThrottle() func(map[string]float64) {
	if m == nil {
		return nil
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_tenant_throttle_ratio",
		Help: "Share of this node's decisions for a tenant that were denied or soft over the last events flush, for its most throttled tenants (at most 20).",
	}, []string{"tenant"})
	m.reg.MustRegister(g)
	return func(ratios map[string]float64) {
		g.Reset()
		for tenant, r := range ratios {
			g.WithLabelValues(tenant).Set(r)
		}
	}
}
