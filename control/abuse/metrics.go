package abuse

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/control"
)

// Severities of a flag.
const (
	SeverityHigh   = "high"
	SeverityMedium = "medium"
)

// Status is the outcome of one due run of the detector on one node.
type Status string

// Statuses, the values of sluice_abuse_runs_total's label.
const (
	// StatusOK: this node held the lease and ran.
	StatusOK Status = "ok"
	// StatusError: the run or the lease failed; the detector tries again next interval.
	StatusError Status = "error"
	// StatusNotLeader: another node holds the lease and runs the detector.
	StatusNotLeader Status = "not_leader"
	// StatusIdle: a step between runs that only kept or watched the lease; not counted.
	StatusIdle Status = ""
)

// Metrics holds the detector's collectors. A nil *Metrics records nothing.
type Metrics struct {
	flags     *prometheus.CounterVec
	runs      *prometheus.CounterVec
	overrides *prometheus.CounterVec
	skipped   prometheus.Counter
}

// NewMetrics registers sluice_abuse_flags_total, sluice_abuse_runs_total,
// sluice_abuse_penalties_skipped_total and sluice_overrides_applied_total with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		flags: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_abuse_flags_total",
			Help: "Targets (tenants, or identities without a tenant) the abuse detector found throttled over its window, per run, by severity: high (above --abuse-threshold, penalized when an override can name it) or medium (from 0.6, logged only).",
		}, []string{"severity"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_abuse_runs_total",
			Help: "Abuse detector intervals on this node by status: ok (held the lease and ran), error, not_leader (another node runs it).",
		}, []string{"status"}),
		overrides: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_overrides_applied_total",
			Help: "Overrides created on this node, by type (ban, multiplier, custom) and source (api, automatic: the abuse detector).",
		}, []string{"type", "source"}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_abuse_penalties_skipped_total",
			Help: "Targets the abuse detector would have penalized but left out because a run had created --abuse-max-penalties overrides already (the worst offenders go first); they are judged again at the next run.",
		}),
	}
	reg.MustRegister(m.flags, m.runs, m.overrides, m.skipped)
	// Every series from the start at 0, so that rate() and alerts see the first increase.
	for _, s := range []string{SeverityHigh, SeverityMedium} {
		m.flags.WithLabelValues(s)
	}
	for _, s := range []Status{StatusOK, StatusError, StatusNotLeader} {
		m.runs.WithLabelValues(string(s))
	}
	m.overrides.WithLabelValues(string(control.OverrideMultiplier), string(control.SourceAutomatic))
	return m
}

// Flag counts a target found at severity.
func (m *Metrics) Flag(severity string) {
	if m != nil {
		m.flags.WithLabelValues(severity).Inc()
	}
}

// PenaltiesSkipped counts n penalties a run's cap left out.
func (m *Metrics) PenaltiesSkipped(n int) {
	if m != nil {
		m.skipped.Add(float64(n))
	}
}

// Run counts one due run by status; StatusIdle is not counted.
func (m *Metrics) Run(s Status) {
	if m != nil && s != StatusIdle {
		m.runs.WithLabelValues(string(s)).Inc()
	}
}

// OverrideApplied counts an override created in the control store.
func (m *Metrics) OverrideApplied(t control.OverrideType, s control.Source) {
	if m != nil {
		m.overrides.WithLabelValues(string(t), string(s)).Inc()
	}
}
