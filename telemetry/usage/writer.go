package usage

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/key"
)

// usageKey and violationKey are the rows of the counts; minute is Unix seconds / 60.
type usageKey struct {
	minute       int64
	rule, tenant string
}

type usageVal struct{ allowed, denied, soft int64 }

type violationKey struct {
	minute                                   int64
	rule, tenant, user, apiKey, ip, endpoint string
}

type violationVal struct{ denied, soft, limit int64 }

// counts are the sums gathered since the last hand-over. total is what they add up to, usage
// and violations together, so that counts lost whole are counted as such.
//
// Values are pointers so that a row is updated without assigning its key again: a map
// assignment replaces an existing string key with the one assigned, which would be the
// request's substring (see add).
type counts struct {
	usage      map[usageKey]*usageVal
	violations map[violationKey]*violationVal
	total      int64
}

func newCounts() *counts {
	return &counts{usage: map[usageKey]*usageVal{}, violations: map[violationKey]*violationVal{}}
}

func (c *counts) rows() int { return len(c.usage) + len(c.violations) }

// handoff carries counts to the writer; done, when set, receives the write's result.
type handoff struct {
	c    *counts
	done chan error
}

// gather takes events from the queue into counts and hands them to the writer every Flush.
// It never waits on the store: while the writer is busy it keeps gathering and hands over
// at a later tick, so the queue drains at the speed of a map update, whatever the store does.
//
// It polls the queue every Poll rather than waiting on it: a send that finds the receiver
// parked must make it runnable, and may wake an idle thread (a futex call), on the deciding
// goroutine's time; a send into the buffer costs a lock and a copy (BenchmarkRecord/serial).
func (r *Recorder) gather() {
	defer close(r.gDone)
	defer close(r.handoff)
	tick := time.NewTicker(r.o.Flush)
	defer tick.Stop()
	poll := time.NewTicker(r.o.Poll)
	defer poll.Stop()
	c := newCounts()
	for {
		select {
		case <-poll.C:
			r.drain(c)
		case <-tick.C:
			r.drain(c)
			select {
			case r.handoff <- handoff{c: c}:
				c = newCounts()
			default: // the writer is still writing: hand over at the next tick
			}
		case done := <-r.flushes:
			r.drain(c)
			r.handoff <- handoff{c: c, done: done}
			c = newCounts()
		case <-r.stop:
			r.drain(c)
			r.handoff <- handoff{c: c}
			return
		}
	}
}

// drain adds every event queued now.
func (r *Recorder) drain(c *counts) {
	for {
		select {
		case e := <-r.q:
			r.add(c, &e)
		default:
			return
		}
	}
}

// add counts e's limits in c at the current minute. Rows past MaxRows are not created; the
// counts they would have held are lost and counted (one for the usage row, one for the
// violation row).
func (r *Recorder) add(c *counts, e *event) {
	now := r.o.Now()
	minute := now.Unix() / 60
	var apiKey string // hashed once per event, and only for a violation
	if e.last {
		r.addDecision(c, minute, e.tenant, e.final)
	}
	for i := range e.results[:e.n] {
		res := &e.results[i]
		rule := res.rule
		if rule == "" && res.envoy != nil {
			rule = res.envoy.Label()
		}
		rule = storable(rule, MaxNameLen)
		if rule == "" {
			continue
		}
		if r.o.Observe != nil {
			if apiKey == "" && e.apiKey != "" {
				apiKey = key.HashedAPIKey(e.apiKey)
			}
			r.o.Observe(Observation{Rule: rule, Tenant: e.tenant, User: e.user, APIKey: apiKey, IP: e.ip, Outcome: Outcome(res.outcome), At: now})
		}
		uk := usageKey{minute, rule, storable(e.tenant, MaxValueLen)}
		u := c.usage[uk]
		if u == nil {
			if c.rows() >= r.o.MaxRows {
				r.lost.Add(1)
				if res.outcome != allowed {
					r.lost.Add(1)
				}
				continue
			}
			// A new row's strings are copied: an RLS request's are substrings of one copy
			// of the whole request (transport/rls decodeRequest), which a row's key would keep
			// alive until the hand-over.
			uk.tenant = strings.Clone(uk.tenant)
			u = &usageVal{}
			c.usage[uk] = u
		}
		c.total++
		switch res.outcome {
		case allowed:
			u.allowed++
		case soft:
			u.soft++
		case denied:
			u.denied++
		}
		if res.outcome == allowed {
			continue
		}
		if apiKey == "" && e.apiKey != "" {
			apiKey = key.HashedAPIKey(e.apiKey)
		}
		vk := violationKey{minute, rule, uk.tenant, storable(e.user, MaxValueLen), apiKey,
			storable(e.ip, MaxValueLen), storable(e.endpoint, MaxValueLen)}
		v := c.violations[vk]
		if v == nil {
			if c.rows() >= r.o.MaxRows {
				r.lost.Add(1)
				continue
			}
			vk.tenant, vk.user = strings.Clone(vk.tenant), strings.Clone(vk.user)
			vk.ip, vk.endpoint = strings.Clone(vk.ip), strings.Clone(vk.endpoint)
			v = &violationVal{}
			c.violations[vk] = v
		}
		c.total++
		if res.outcome == soft {
			v.soft++
		} else {
			v.denied++
		}
		v.limit = max(res.limit, 0)
	}
}

// addDecision counts one request once under the usage row of DecisionRule (rule ""), by its
// final state: denied if any limit denied it, soft if allowed and any limit was soft, else
// allowed. GET /admin/v1/usage/history without rule= reads these rows.
func (r *Recorder) addDecision(c *counts, minute int64, tenant string, final outcome) {
	uk := usageKey{minute, DecisionRule, storable(tenant, MaxValueLen)}
	u := c.usage[uk]
	if u == nil {
		if c.rows() >= r.o.MaxRows {
			r.lost.Add(1)
			return
		}
		uk.tenant = strings.Clone(uk.tenant)
		u = &usageVal{}
		c.usage[uk] = u
	}
	c.total++
	switch final {
	case allowed:
		u.allowed++
	case soft:
		u.soft++
	case denied:
		u.denied++
	}
}

// merge adds from's counts to c, within MaxRows; it returns the counts of the rows it could
// not take.
func (r *Recorder) merge(c, from *counts) int64 {
	var lost int64
	c.total += from.total
	for k, v := range from.usage {
		u := c.usage[k]
		if u == nil {
			if c.rows() >= r.o.MaxRows {
				lost += v.allowed + v.denied + v.soft
				continue
			}
			u = &usageVal{}
			c.usage[k] = u
		}
		u.allowed, u.denied, u.soft = u.allowed+v.allowed, u.denied+v.denied, u.soft+v.soft
	}
	for k, v := range from.violations {
		w := c.violations[k]
		if w == nil {
			if c.rows() >= r.o.MaxRows {
				lost += v.denied + v.soft
				continue
			}
			w = &violationVal{}
			c.violations[k] = w
		}
		w.denied, w.soft, w.limit = w.denied+v.denied, w.soft+v.soft, v.limit
	}
	c.total -= lost
	return lost
}

// write writes each hand-over to the store. Counts the store did not take are kept and
// written with the next hand-over (the store adds, so nothing is counted twice), up to
// MaxRows; counts it refused as invalid are dropped, or they would block every later write.
func (r *Recorder) write() {
	defer close(r.wDone)
	var pending *counts
	for h := range r.handoff {
		if r.o.TenantThrottle != nil {
			r.o.TenantThrottle(tenantThrottle(h.c, TopTenants))
		}
		if pending == nil {
			pending = h.c
		} else {
			r.lost.Add(r.merge(pending, h.c))
		}
		var err error
		if pending.rows() == 0 {
			pending = nil
		} else {
			err = r.store(pending)
			switch {
			case err == nil:
				pending = nil
			case errors.Is(err, ErrRefused):
				r.log.Error("decision counts refused by the control store; dropped", "rows", pending.rows(), "err", err)
				r.lost.Add(pending.total)
				pending = nil
			default:
				r.log.Warn("decision counts not written; retrying with the next flush", "rows", pending.rows(), "err", err)
			}
		}
		if h.done != nil {
			h.done <- err
		}
	}
	if pending != nil {
		r.lost.Add(pending.total)
		r.log.Error("decision counts not written before shutdown; lost", "rows", pending.rows())
	}
}

// store writes c in one AddCounts.
func (r *Recorder) store(c *counts) error {
	usage := make([]UsageCount, 0, len(c.usage))
	for k, v := range c.usage {
		usage = append(usage, UsageCount{Minute: minuteTime(k.minute), Rule: k.rule, Tenant: k.tenant,
			Allowed: v.allowed, Denied: v.denied, Soft: v.soft})
	}
	violations := make([]ViolationCount, 0, len(c.violations))
	for k, v := range c.violations {
		violations = append(violations, ViolationCount{Minute: minuteTime(k.minute), Rule: k.rule,
			Tenant: k.tenant, User: k.user, APIKey: k.apiKey, IP: k.ip, Endpoint: k.endpoint,
			Denied: v.denied, Soft: v.soft, Limit: v.limit})
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.o.WriteTimeout)
	defer cancel()
	start := time.Now()
	err := r.o.Writer.WriteCounts(ctx, usage, violations)
	r.writes.Add(1)
	if err != nil {
		r.writeErrors.Add(1)
		return err
	}
	r.rows.Add(int64(len(usage) + len(violations)))
	r.log.Debug("decision counts written", "usage_rows", len(usage), "violation_rows", len(violations), "took", time.Since(start))
	return nil
}

func minuteTime(m int64) time.Time { return time.Unix(m*60, 0).UTC() }

// storable returns s as the control store keeps text (control.CheckText, within MaxNameLen or MaxValueLen): within max
// characters, valid UTF-8, no NUL. Request attributes may hold NUL and run to 1024 bytes; such
// a value is kept readable, its NULs and invalid bytes replaced and its tail cut, and made
// distinct again by a suffix of its hash ("~" and 16 hex digits), so two long values that
// share a prefix do not share a row.
func storable(s string, max int) string {
	if len(s) <= max && strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	clean := strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	if clean == s && utf8.RuneCountInString(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	const suffix = 1 + 16
	var b strings.Builder
	n := 0
	for _, c := range clean {
		if n == max-suffix {
			break
		}
		b.WriteRune(c)
		n++
	}
	b.WriteByte('~')
	b.WriteString(hex.EncodeToString(sum[:8]))
	return b.String()
}

// tenantThrottle returns the throttle ratio (denied and soft over all decisions, every rule
// together) of the top tenants by throttled decisions in c; requests with no tenant are left
// out, as are tenants nothing was throttled for.
func tenantThrottle(c *counts, top int) map[string]float64 {
	type sums struct{ throttled, total int64 }
	by := map[string]*sums{}
	for k, v := range c.usage {
		if k.tenant == "" || k.rule == DecisionRule { // the per-decision rows are not a rule's
			continue
		}
		s := by[k.tenant]
		if s == nil {
			s = &sums{}
			by[k.tenant] = s
		}
		s.throttled += v.denied + v.soft
		s.total += v.allowed + v.denied + v.soft
	}
	names := make([]string, 0, len(by))
	for t, s := range by {
		if s.throttled > 0 {
			names = append(names, t)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(by[b].throttled, by[a].throttled); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := make(map[string]float64, min(top, len(names)))
	for _, t := range names[:min(top, len(names))] {
		out[t] = float64(by[t].throttled) / float64(by[t].total)
	}
	return out
}
