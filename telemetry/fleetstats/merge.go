package fleetstats

import (
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/sketch"
)

// Fleet is the fleet's statistics: every live node's, merged.
type Fleet struct {
	At time.Time `json:"at"`
	// P99Ms is the worst node's p99 decision latency: percentiles of different nodes do not
	// add up, and the slowest node is the one to look at.
	P99Ms float64 `json:"p99_ms"`
	// Rules adds up every node's rates and totals per rule (their top lists are GET top's).
	Rules []FleetRule  `json:"rules"`
	Nodes []NodeHealth `json:"nodes"`
}

// FleetRule is one rule's rates and totals over the fleet.
type FleetRule struct {
	Rule  string `json:"rule"`
	Rate  Rates  `json:"rate"`
	Total Counts `json:"total"`
}

// Merge adds up nodes' statistics.
func Merge(at time.Time, nodes []NodeStats) Fleet {
	f := Fleet{At: at.UTC(), Rules: []FleetRule{}, Nodes: []NodeHealth{}}
	rules := map[string]*FleetRule{}
	for _, n := range nodes {
		f.P99Ms = max(f.P99Ms, n.P99Ms)
		f.Nodes = append(f.Nodes, n.NodeHealth)
		for _, r := range n.Rules {
			fr, ok := rules[r.Rule]
			if !ok {
				fr = &FleetRule{Rule: r.Rule}
				rules[r.Rule] = fr
			}
			fr.Rate.Allowed += r.Rate.Allowed
			fr.Rate.Soft += r.Rate.Soft
			fr.Rate.Denied += r.Rate.Denied
			fr.Total.Allowed += r.Total.Allowed
			fr.Total.Soft += r.Total.Soft
			fr.Total.Denied += r.Total.Denied
		}
	}
	for _, r := range rules {
		f.Rules = append(f.Rules, *r)
	}
	slices.SortFunc(f.Rules, func(a, b FleetRule) int { return strings.Compare(a.Rule, b.Rule) })
	slices.SortFunc(f.Nodes, func(a, b NodeHealth) int { return strings.Compare(a.Node, b.Node) })
	return f
}

// TopConsumer is one consumer of a rule in the fleet's top list. Count is an upper bound of
// its decisions over the top window, Count - Error a lower bound (the sketch's guarantee).
type TopConsumer struct {
	Tenant   string `json:"tenant"`
	Consumer string `json:"consumer"`
	Count    int64  `json:"count"`
	Error    int64  `json:"error"`
}

// TopRule is a rule's fleet-wide top list.
type TopRule struct {
	Rule      string        `json:"rule"`
	Consumers []TopConsumer `json:"consumers"`
}

// Top merges the nodes' top lists of rule (every rule when empty) into at most limit
// consumers each.
func Top(nodes []NodeStats, rule string, limit int) []TopRule {
	parts := map[string][]sketch.Summary{}
	for _, n := range nodes {
		for _, r := range n.Rules {
			if rule == "" || r.Rule == rule {
				parts[r.Rule] = append(parts[r.Rule], r.Top)
			}
		}
	}
	out := []TopRule{}
	for name, ps := range parts {
		m := sketch.Merge(limit, ps...)
		tr := TopRule{Rule: name, Consumers: make([]TopConsumer, len(m.Counters))}
		for i, c := range m.Counters {
			tenant, id := splitConsumer(c.Key)
			tr.Consumers[i] = TopConsumer{Tenant: tenant, Consumer: id, Count: c.Count, Error: c.Err}
		}
		out = append(out, tr)
	}
	slices.SortFunc(out, func(a, b TopRule) int { return strings.Compare(a.Rule, b.Rule) })
	return out
}
