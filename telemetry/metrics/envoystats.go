package metrics

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy/envoyconf"
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

// EnvoyHits are the reference service's five stats of one request under one limit, in hits.
type EnvoyHits struct {
	Total, Within, Near, Over, Shadow uint64
}

// envoyHits counts the hits of one descriptor status as Envoy's reference service counts them
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
func envoyHits(st *sluice.DescriptorStatus, consumed bool) EnvoyHits {
	hits, limit := st.Hits, uint64(st.RequestsPerUnit)
	used := limit - min(limit, uint64(st.Remaining))
	before, after := used, used+hits
	if consumed {
		before, after = used-min(used, hits), used
	}
	near := uint64(math.Floor(float64(float32(limit) * NearLimitRatio)))
	h := EnvoyHits{Total: hits}
	if after > limit {
		if before >= limit {
			h.Over = hits
		} else {
			h.Over = after - limit
			h.Near = limit - max(near, before)
		}
		if st.Shadow {
			h.Shadow = hits
		}
		return h
	}
	if after > near {
		h.Near = min(hits, after-near)
	}
	h.Within = hits
	return h
}

func (h *EnvoyHits) add(o EnvoyHits) {
	h.Total += o.Total
	h.Within += o.Within
	h.Near += o.Near
	h.Over += o.Over
	h.Shadow += o.Shadow
}

// add counts h in the limit's Prometheus counters.
func (c *envoyCounters) add(h EnvoyHits) {
	for _, x := range [...]struct {
		c prometheus.Counter
		n uint64
	}{{c.total, h.Total}, {c.within, h.Within}, {c.near, h.Near}, {c.over, h.Over}, {c.shadow, h.Shadow}} {
		if x.n > 0 {
			x.c.Add(float64(x.n))
		}
	}
}

// MaxEnvoyValueKeys bounds the per-value stats keys (detailed_metric, value_to_metric) held
// between two drains: requests' values are unbounded, a StatsD server's memory is not. Hits
// under a key past the bound are counted under the limit's own stats key instead, and in
// sluice_envoy_value_stats_overflow_total.
const MaxEnvoyValueKeys = 10000

// maxEnvoyValueKeyLen bounds one per-value key: a longer one is counted as past the bound.
const maxEnvoyValueKeyLen = 512

// envoyValueStats holds the hits of per-value stats keys since the last drain.
type envoyValueStats struct {
	on   atomic.Bool // set by EnableEnvoyValueStats: nothing is counted for no reader
	mu   sync.Mutex
	hits map[string]*EnvoyHits
	key  []byte // scratch for the key of the request being counted
}

// countPerValue counts h under the request's per-value stats key of l.
func (m *Metrics) countPerValue(l *envoyconf.Limit, entries []envoyconf.Entry, h EnvoyHits) {
	v := &m.envoyValues
	if !v.on.Load() {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.key = l.AppendStatKey(v.key[:0], entries)
	if c, ok := v.hits[string(v.key)]; ok {
		c.add(h)
		return
	}
	key := string(v.key)
	if len(v.hits) >= MaxEnvoyValueKeys || len(key) > maxEnvoyValueKeyLen {
		m.envoyOverflow.Add(float64(h.Total))
		key = l.StatKey
		if c, ok := v.hits[key]; ok {
			c.add(h)
			return
		}
	}
	if v.hits == nil {
		v.hits = make(map[string]*EnvoyHits)
	}
	c := h
	v.hits[key] = &c
}

// EnableEnvoyValueStats starts counting per-value stats for DrainEnvoyValueStats; without a
// reader they are not kept.
func (m *Metrics) EnableEnvoyValueStats() {
	if m != nil {
		m.envoyValues.on.Store(true)
	}
}

// DrainEnvoyValueStats calls f with the hits counted under each per-value stats key (the
// reference service's name of a detailed_metric or value_to_metric limit for one request's
// values, see envoyconf.Limit.AppendStatKey) since the last drain, and forgets them. The
// StatsD sink sends them; Prometheus has them only summed per limit, in
// sluice_envoy_stats_total, as their number is unbounded.
func (m *Metrics) DrainEnvoyValueStats(f func(key string, h EnvoyHits)) {
	if m == nil {
		return
	}
	v := &m.envoyValues
	v.mu.Lock()
	hits := v.hits
	v.hits = nil
	v.mu.Unlock()
	for k, h := range hits {
		f(k, *h)
	}
}
