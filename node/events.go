package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// eventsConfig is how decisions are counted for the violations log and usage history.
type eventsConfig struct {
	flush time.Duration
	queue int
}

// eventFlags adds the flags of eventsConfig to f.
func eventFlags(f *pflag.FlagSet, c *eventsConfig) {
	f.DurationVar(&c.flush, "events-flush", durationEnv("SLUICE_EVENTS_FLUSH", usage.DefaultFlush), "how often this node writes its decision counts (usage history, violations) to the control store (SLUICE_EVENTS_FLUSH)")
	f.IntVar(&c.queue, "events-queue", intEnv("SLUICE_EVENTS_QUEUE", usage.DefaultQueue), "decision events this node holds waiting to be counted; past it they are dropped, never waited for, and counted in sluice_events_dropped_total (SLUICE_EVENTS_QUEUE)")
}

// startEvents starts the recorder that counts this node's decisions into ctrl, and shows each
// limit's outcome to observe (the dashboard's live statistics) on its gathering goroutine.
func startEvents(c eventsConfig, ctrl control.Store, m *metrics.Metrics, observe func(usage.Observation), log *slog.Logger) (*usage.Recorder, error) {
	if c.flush <= 0 {
		return nil, fmt.Errorf("--events-flush: %v: must be above 0", c.flush)
	}
	if c.queue < 1 {
		return nil, fmt.Errorf("--events-queue: %d: must be at least 1", c.queue)
	}
	rec, err := usage.New(usage.Options{Writer: UsageWriter(ctrl), Flush: c.flush, Queue: c.queue, Logger: log, TenantThrottle: m.TenantThrottle(), Observe: observe})
	if err != nil {
		return nil, err
	}
	m.WatchEvents(func() metrics.EventStats {
		s := rec.Stats()
		return metrics.EventStats{Dropped: s.Dropped, Lost: s.Lost, Writes: s.Writes, WriteErrors: s.WriteErrors, Rows: s.Rows, Queued: s.Queued}
	})
	return rec, nil
}

// closeEvents writes the counts of the last decisions; called once the listeners stopped.
func closeEvents(rec *usage.Recorder, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rec.Close(ctx); err != nil {
		log.Warn("decision counts", "err", err)
	}
}
