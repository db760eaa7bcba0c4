package node

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/escalation"
)

// newEscalator returns the node's escalation writer (rules' escalation: a burst warns, a burst
// while warned bans), whose Report is the Limiter's burst hook, and exports the bursts it had
// to drop as sluice_escalation_dropped_total.
// applied, when set, counts each penalty written (sluice_overrides_applied_total).
func newEscalator(ctrl control.Store, reg prometheus.Registerer, log *slog.Logger, applied func(control.Override)) (*escalation.Escalator, error) {
	esc, err := escalation.New(escalation.Options{Store: ctrl, Logger: log, Applied: applied})
	if err != nil {
		return nil, err
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_escalation_dropped_total",
		Help: "Bursts detected by rules' escalation that found the penalty queue full and were not penalized.",
	}, func() float64 { return float64(esc.Dropped()) }))
	return esc, nil
}
