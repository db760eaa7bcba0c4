package policy

import (
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// RegionMode says how a rule's limit spans regions (docs/architecture.md, Regions).
type RegionMode uint8

const (
	// RegionLocal is a limit per region: each region's store counts it alone (the default).
	RegionLocal RegionMode = iota
	// RegionGlobal is one limit across all regions: each region admits against its own count,
	// the others' last reported counts and a reservation of their in-flight demand.
	RegionGlobal
	// RegionHome is one limit decided in one region, the home: other regions forward its
	// decisions there (one cross-region round trip).
	RegionHome
)

// compileRegions reads a rule's regions field. Global rules must use a window algorithm: their
// state is a count per window, which is what regions exchange.
func compileRegions(rule, v string, kind algorithm.Kind, bad func(field, format string, args ...any)) (RegionMode, string) {
	switch {
	case v == "":
		return RegionLocal, ""
	case kind == algorithm.Concurrency:
		// A slot is a lease held in one store: regions share counts, not leases.
		bad("regions", "rule %q: concurrency limits are per region (regions share counts, not leases)", rule)
		return RegionLocal, ""
	case v == "global":
		if kind != 0 && kind != algorithm.FixedWindow && kind != algorithm.SlidingWindowCounter {
			bad("regions", "rule %q: global needs a window algorithm (fixed_window or sliding_window_counter), not %s", rule, kind)
		}
		return RegionGlobal, ""
	case strings.HasPrefix(v, "home:"):
		name := strings.TrimPrefix(v, "home:")
		if err := ValidRegionName(name); err != "" {
			bad("regions", "rule %q: home:NAME: %s", rule, err)
			return RegionLocal, ""
		}
		return RegionHome, name
	}
	bad("regions", "rule %q: %q is not global or home:NAME", rule, v)
	return RegionLocal, ""
}

// ValidRegionName returns why name cannot name a region, or "" when it can: 1 to 64 letters,
// digits, '-', '_' or '.' (the same rule as for an Envoy-format limit's home region).
func ValidRegionName(name string) string { return envoyconf.ValidRegionName(name) }

// Regions returns the rule's regions mode and, for RegionHome, the home region's name.
func (c *CompiledRule) Regions() (RegionMode, string) { return c.regions, c.home }

// Head returns the start that every bucket key of the rule shares (sl:<name>:<version>). It is
// the caller's to read, never to change.
func (c *CompiledRule) Head() []byte { return c.head }

// RegionRules returns the rules whose regions mode is global or home, in policy order.
func (s *Snapshot) RegionRules() []*CompiledRule {
	var out []*CompiledRule
	for _, r := range s.rules {
		if r.regions != RegionLocal {
			out = append(out, r)
		}
	}
	return out
}

// MaxPeriod returns the longest period of the rule's limits, its tiers' included: how long a
// count of the rule can matter.
func (c *CompiledRule) MaxPeriod() time.Duration {
	p := c.base.Period
	for _, t := range c.tiers {
		p = max(p, t.Period)
	}
	return p
}
