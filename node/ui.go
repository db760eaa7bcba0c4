package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/ui"
	"github.com/sluicehq/sluice/internal/sketch"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
)

// startFleetStats starts this node's live statistics for the dashboard (docs/architecture.md,
// Dashboard): fed by the decision recorder's Observe on its gathering goroutine, never on a
// deciding one, sampled once a second for the p99 latency and the breaker state from reg and
// the store's health from st, until ctx ends. Its snapshot goes out with every heartbeat
// (heartbeatStats) and answers GET /admin/v1/stats for this node.
func startFleetStats(ctx context.Context, node, storeName string, st sluice.Store, reg prometheus.Gatherer, log *slog.Logger) *fleetstats.Collector {
	c := fleetstats.New(fleetstats.Options{
		Node: node, Store: storeName, StoreUp: storeCheck(st), Gatherer: reg, Logger: log,
	})
	go c.Run(ctx)
	return c
}

// heartbeatStats returns c's snapshot as JSON for controlplane.Options.Stats, within
// control.MaxNodeStatsLen, which the control store refuses past: when the whole snapshot is
// too long (thousands of rules with long consumer keys), the top lists are left out, and when
// even that is too long, the heartbeat carries no stats rather than failing.
func heartbeatStats(c *fleetstats.Collector, log *slog.Logger) func() []byte {
	return func() []byte {
		s := c.Snapshot()
		b, err := json.Marshal(s)
		if err == nil && len(b) <= control.MaxNodeStatsLen {
			return b
		}
		for i := range s.Rules {
			s.Rules[i].Top = sketch.Summary{}
		}
		b, err = json.Marshal(s)
		if err != nil || len(b) > control.MaxNodeStatsLen {
			log.Warn("fleet stats too long for a heartbeat; sent without them", "rules", len(s.Rules), "bytes", len(b), "err", err)
			return nil
		}
		log.Debug("fleet stats: top lists left out of the heartbeat to fit", "rules", len(s.Rules), "bytes", len(b))
		return b
	}
}

// mountUI serves the dashboard at /ui/ on mux, and sends GET / there: nothing else answers
// the bare root (the HTTP API lives under /v1/, the admin API under /admin/v1/).
func mountUI(mux *http.ServeMux) {
	mux.Handle(ui.Prefix, ui.Handler())
	mux.Handle("GET /{$}", http.RedirectHandler(ui.Prefix, http.StatusFound))
}
