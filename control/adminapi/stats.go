package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// Bounds of GET /admin/v1/top's limit.
const (
	DefaultTopLimit = 10
	MaxTopLimit     = 100
)

// FleetStats builds the answers of GET /admin/v1/stats and /admin/v1/top from the statistics
// the live nodes reported in their heartbeats (JSON, by node id). telemetry/fleetstats.View
// implements it; the admin API declares it so that the control plane never imports telemetry.
type FleetStats interface {
	// Stats is the body of GET /admin/v1/stats.
	Stats(now time.Time, reported map[string][]byte) any
	// Top is the "rules" of GET /admin/v1/top: each rule's heaviest consumers ("" for all).
	Top(reported map[string][]byte, rule string, limit int) any
}

// errNoFleetStats answers the statistics calls of a node that collects none.
var errNoFleetStats = fmt.Errorf("fleet statistics are not collected by this node: %w", control.ErrNotFound)

// reported returns what the live nodes' last heartbeats carried, by node id. While the
// control store does not answer, none: the FleetStats still has this node's own, so the
// dashboard stays live on the node it is served from.
func (s *Server) reported(ctx context.Context) map[string][]byte {
	out := map[string][]byte{}
	ns, err := s.store.Nodes(ctx, s.now().Add(-s.opts.NodeWindow))
	if err != nil {
		s.log.Warn("fleet stats: list nodes; answering with this node's alone", "err", err)
		return out
	}
	for _, n := range ns {
		out[n.ID] = n.Stats
	}
	return out
}

// stats answers GET /admin/v1/stats: decisions per second and totals per rule over the fleet,
// and each node's store, breaker and p99 latency.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	if s.opts.Fleet == nil {
		return errNoFleetStats
	}
	return answer(w, http.StatusOK, "", s.opts.Fleet.Stats(s.now(), s.reported(r.Context())))
}

// top answers GET /admin/v1/top?rule=&limit=: each rule's heaviest consumers over the fleet,
// merged from every node's bounded sketch.
func (s *Server) top(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "rule", "limit")
	if err != nil {
		return err
	}
	rule := q.Get("rule")
	if q.Has("rule") {
		if err := control.CheckText("rule", rule, 1, control.MaxNameLen); err != nil {
			return err
		}
	}
	limit := DefaultTopLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxTopLimit {
			return &policy.FieldError{Field: "limit", Msg: fmt.Sprintf("must be an integer from 1 to %d", MaxTopLimit)}
		}
		limit = n
	}
	if s.opts.Fleet == nil {
		return errNoFleetStats
	}
	return answer(w, http.StatusOK, "", map[string]any{"rules": s.opts.Fleet.Top(s.reported(r.Context()), rule, limit)})
}
