package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/server/escalation"
)

// newEscalator returns the node's escalation writer (rules' escalation: a burst warns, a burst
// while warned bans), whose Report is the Limiter's burst hook, and exports the bursts it had
// to drop as sluice_escalation_dropped_total.
func newEscalator(ctrl control.Store, reg prometheus.Registerer, log *slog.Logger) (*escalation.Escalator, error) {
	esc, err := escalation.New(escalation.Options{Store: ctrl, Logger: log})
	if err != nil {
		return nil, err
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_escalation_dropped_total",
		Help: "Bursts detected by rules' escalation that found the penalty queue full and were not penalized.",
	}, func() float64 { return float64(esc.Dropped()) }))
	return esc, nil
}
