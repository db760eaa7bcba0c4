package fleetstats

import (
	"encoding/json"
	"log/slog"
	"slices"
	"time"
)

// View answers the admin API's fleet statistics (GET /admin/v1/stats and /admin/v1/top) from
// what the live nodes reported in their heartbeats, JSON by node id, with this node's taken
// fresh from Local. It implements control/adminapi.FleetStats.
type View struct {
	// Local returns this node's statistics now; nil for none.
	Local func() NodeStats
	// Logger receives the reports that do not decode; slog.Default() when nil.
	Logger *slog.Logger
}

// Stats returns the fleet's statistics: Merge of the nodes'.
func (v View) Stats(now time.Time, reported map[string][]byte) any {
	return Merge(now, v.nodes(reported))
}

// Top returns each rule's heaviest consumers over the fleet (all rules when rule is "").
func (v View) Top(reported map[string][]byte, rule string, limit int) any {
	return Top(v.nodes(reported), rule, limit)
}

// nodes decodes the reports, by node id, with this node's own from Local, which is fresher
// than its last heartbeat. A report that does not decode is left out.
func (v View) nodes(reported map[string][]byte) []NodeStats {
	var local string
	var out []NodeStats
	if v.Local != nil {
		n := v.Local()
		local = n.Node
		out = append(out, n)
	}
	ids := make([]string, 0, len(reported))
	for id := range reported {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		raw := reported[id]
		if id == local || len(raw) == 0 {
			continue
		}
		var st NodeStats
		if err := json.Unmarshal(raw, &st); err != nil {
			log := v.Logger
			if log == nil {
				log = slog.Default()
			}
			log.Debug("fleet stats: a node's stats do not decode; left out", "node", id, "err", err)
			continue
		}
		st.Node = id
		out = append(out, st)
	}
	return out
}
