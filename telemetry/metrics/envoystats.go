package metrics

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// NearLimitRatio is the share of a limit past which Envoy's reference service counts hits as
// near_limit (its NEAR_LIMIT_RATIO, default 0.8).
const NearLimitRatio = 0.8

// envoyCounters are the sluice_envoy_stats_total counters of one Envoy-format limit.
type envoyCounters struct {
	total, within, near, over, shadow prometheus.Counter
}

// envoyCounters returns rule's counters, made on first use.
func (m *Metrics) envoyCounters(rule string) *envoyCounters {
	return cached(&m.envoyByRule, &m.mu, rule, func() *envoyCounters {
		c := func(stat string) prometheus.Counter { return m.envoyStats.WithLabelValues(rule, stat) }
		return &envoyCounters{total: c("total_hits"), within: c("within_limit"), near: c("near_limit"), over: c("over_limit"), shadow: c("shadow_mode")}
	})
}

// add counts the hits of one descriptor status as Envoy's reference service counts them
// (src/limiter/base_limiter.go): every hit in total_hits; a request within the limit in
// within_limit, and the part of its hits past NearLimitRatio of the limit in near_limit; a
// request over it in over_limit for the part past the limit and near_limit for the part
// between the near threshold and the limit; a shadow limit's over-limit hits in shadow_mode too.
//
// The count before and after the request is read from what remains: a request that consumed
// took its hits (before = limit - remaining - hits, after = limit - remaining); one that did
// not (denied, by this limit or another, or over a shadow limit) took nothing in Sluice, where
// the reference counts its hits anyway (before = limit - remaining, after = before + hits).
// As there, it is over when after passes the limit. That is exact for fixed windows, the
// reference's only algorithm.
func (c *envoyCounters) add(st *sluice.DescriptorStatus, consumed bool) {
	hits, limit := st.Hits, uint64(st.RequestsPerUnit)
	used := limit - min(limit, uint64(st.Remaining))
	before, after := used, used+hits
	if consumed {
		before, after = used-min(used, hits), used
	}
	over := after > limit
	near := uint64(math.Floor(float64(float32(limit) * NearLimitRatio)))
	c.total.Add(float64(hits))
	if over {
		if before >= limit {
			c.over.Add(float64(hits))
		} else {
			c.over.Add(float64(after - limit))
			c.near.Add(float64(limit - max(near, before)))
		}
		if st.Shadow {
			c.shadow.Add(float64(hits))
		}
		return
	}
	if after > near {
		if before >= near {
			c.near.Add(float64(hits))
		} else {
			c.near.Add(float64(after - near))
		}
	}
	c.within.Add(float64(hits))
}
