package abuse

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/control"
)

// value reads a counter, for tests.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// Runs, Flags and Applied read the counters, for tests.
func (m *Metrics) Runs(s Status) float64         { return value(m.runs.WithLabelValues(string(s))) }
func (m *Metrics) Flags(severity string) float64 { return value(m.flags.WithLabelValues(severity)) }
func (m *Metrics) Applied(typ, source string) float64 {
	return value(m.overrides.WithLabelValues(typ, source))
}

// Skipped reads sluice_abuse_penalties_skipped_total, for tests.
func (m *Metrics) Skipped() float64 { return value(m.skipped) }

// Judge exposes Config.judge: the shares, without a store.
func (c Config) Judge(usage []control.UsageCount, violations []control.ViolationCount) []Flag {
	return c.judge(usage, violations)
}
