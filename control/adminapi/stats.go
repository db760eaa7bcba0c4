package adminapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
)

// Bounds of GET /admin/v1/top's limit.
const (
	DefaultTopLimit = 10
	MaxTopLimit     = 100
)

// fleetNodes returns the live nodes' statistics: what their last heartbeats carried, with
// this node's taken fresh from Options.LocalStats. While the control store does not answer,
// this node's alone, so the dashboard stays live on the node it is served from.
func (s *Server) fleetNodes(ctx context.Context) []fleetstats.NodeStats {
	var local string
	var out []fleetstats.NodeStats
	if s.opts.LocalStats != nil {
		n := s.opts.LocalStats()
		local = n.Node
		out = append(out, n)
	}
	ns, err := s.store.Nodes(ctx, s.now().Add(-s.opts.NodeWindow))
	if err != nil {
		s.log.Warn("fleet stats: list nodes; answering with this node's alone", "err", err)
		return out
	}
	for _, n := range ns {
		if n.ID == local || len(n.Stats) == 0 {
			continue
		}
		var st fleetstats.NodeStats
		if err := json.Unmarshal(n.Stats, &st); err != nil {
			s.log.Debug("fleet stats: a node's stats do not decode; left out", "node", n.ID, "err", err)
			continue
		}
		st.Node = n.ID
		out = append(out, st)
	}
	return out
}

// stats answers GET /admin/v1/stats: decisions per second and totals per rule over the fleet,
// and each node's store, breaker and p99 latency.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	return answer(w, http.StatusOK, "", fleetstats.Merge(s.now(), s.fleetNodes(r.Context())))
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
	return answer(w, http.StatusOK, "", map[string]any{"rules": fleetstats.Top(s.fleetNodes(r.Context()), rule, limit)})
}
