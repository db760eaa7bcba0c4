package sluice

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store"
)

// DescriptorRequest is a request in the shape of Envoy's rate limit service: a domain and
// descriptors, each a list of key/value entries matched against the domain's configuration.
type DescriptorRequest struct {
	Domain      string
	Descriptors []Descriptor
	// HitsAddend is the cost of each descriptor; 0 counts as 1, as in Envoy.
	HitsAddend uint64
}

// Descriptor is one descriptor of a DescriptorRequest.
type Descriptor struct {
	Entries []envoyconf.Entry
	// HitsAddend, when HasHitsAddend, overrides the request's cost for this descriptor; 0 looks
	// without counting.
	HitsAddend    uint64
	HasHitsAddend bool
	// Limit, when set, replaces the configured limit for this request (Envoy's per-descriptor
	// override): requests_per_unit per unit, counted in a fixed window.
	Limit *DescriptorLimit
}

// DescriptorLimit is a per-request limit override.
type DescriptorLimit struct {
	RequestsPerUnit uint32
	Unit            string // second, minute, hour, day, week, month, year
}

// DescriptorStatus is the answer for one descriptor.
type DescriptorStatus struct {
	OK bool
	// Limit is the limit that applied, nil when none did (unknown domain, unmatched,
	// whitelisted, unlimited or replaced). Name, RequestsPerUnit and Unit describe it.
	Limit           *envoyconf.Limit
	HasLimit        bool
	Name            string
	RequestsPerUnit uint32
	Unit            string
	Unlimited       bool
	Remaining       uint32
	ResetAfter      time.Duration
	Shadow          bool // a shadow limit that would have denied
}

// DescriptorDecision is the answer to a DescriptorRequest. Like Decision it keeps its buffers
// for reuse.
type DescriptorDecision struct {
	OK       bool
	Degraded bool
	Statuses []DescriptorStatus

	limits []*envoyconf.Limit
	ops    []store.Op
	opOf   []int // ops[i] decides Statuses[opOf[i]]
	algo   []algorithm.Result
	keys   []byte
	spans  [][2]int
	params []algorithm.Params
}

// unlimitedRemaining is what Envoy reports as remaining for an unlimited descriptor.
const unlimitedRemaining = math.MaxUint32

// maxDescriptors bounds one request; Envoy sends a handful, so more is abuse, not traffic.
const maxDescriptors = 256

// CheckDescriptors decides an Envoy-style request: every descriptor's limit is applied in one
// atomic step, and a denied request consumes nothing from any of them.
func (l *Limiter) CheckDescriptors(ctx context.Context, r *DescriptorRequest, d *DescriptorDecision) error {
	if r.Domain == "" {
		return &policy.FieldError{Field: "domain", Msg: "required"}
	}
	if len(r.Descriptors) == 0 {
		return &policy.FieldError{Field: "descriptors", Msg: "at least one descriptor is required"}
	}
	if len(r.Descriptors) > maxDescriptors {
		return &policy.FieldError{Field: "descriptors", Msg: fmt.Sprintf("at most %d descriptors", maxDescriptors)}
	}
	for i := range r.Descriptors {
		for j, e := range r.Descriptors[i].Entries {
			if len(e.Key) > policy.MaxAttribute || len(e.Value) > policy.MaxAttribute {
				return &policy.FieldError{Field: fmt.Sprintf("descriptors[%d].entries[%d]", i, j), Msg: fmt.Sprintf("longer than %d bytes", policy.MaxAttribute)}
			}
		}
	}
	d.OK, d.Degraded = true, false
	d.Statuses, d.limits, d.ops, d.opOf = d.Statuses[:0], d.limits[:0], d.ops[:0], d.opOf[:0]
	d.keys, d.spans, d.params = d.keys[:0], d.spans[:0], d.params[:0]

	cfg := l.policy.Load().Envoy()
	known := cfg != nil && cfg.HasDomain(r.Domain)
	for i := range r.Descriptors {
		desc := &r.Descriptors[i]
		var lim *envoyconf.Limit
		if known && desc.Limit == nil {
			// A descriptor with no entries, or an entry with no key, matches nothing: as in
			// Envoy's reference service, that is no limit rather than an error.
			lim = cfg.Match(r.Domain, desc.Entries).Limit
		}
		if known && desc.Limit != nil {
			if _, ok := unitPeriod(desc.Limit.Unit); !ok {
				return &policy.FieldError{Field: fmt.Sprintf("descriptors[%d].limit.unit", i), Msg: fmt.Sprintf("unknown unit %q", desc.Limit.Unit)}
			}
		}
		d.limits = append(d.limits, lim)
		d.Statuses = append(d.Statuses, DescriptorStatus{OK: true})
	}
	replaced := envoyconf.Replaced(d.limits)
	for i := range r.Descriptors {
		desc, st, lim := &r.Descriptors[i], &d.Statuses[i], d.limits[i]
		cost := r.HitsAddend
		if cost == 0 {
			cost = 1
		}
		if desc.HasHitsAddend {
			cost = desc.HitsAddend
		}
		// A cost beyond any limit's capacity is denied as such (OVER_LIMIT), as in the reference
		// service; an error would let Envoy's default failure mode wave the request through.
		cost = min(cost, algorithm.MaxLimit+1)
		start := len(d.keys)
		var params *algorithm.Params
		switch {
		case known && desc.Limit != nil:
			period, _ := unitPeriod(desc.Limit.Unit)
			p, err := algorithm.NewParams(algorithm.FixedWindow, int64(desc.Limit.RequestsPerUnit), 0, period)
			if err != nil {
				return &policy.FieldError{Field: fmt.Sprintf("descriptors[%d].limit", i), Msg: err.Error()}
			}
			d.params = append(d.params, p)
			st.HasLimit, st.RequestsPerUnit, st.Unit = true, desc.Limit.RequestsPerUnit, strings.ToLower(desc.Limit.Unit)
			d.keys = appendOverrideKey(d.keys, r.Domain, desc)
		case lim == nil || replaced[i]:
			continue
		case lim.Unlimited:
			st.Unlimited, st.Remaining = true, unlimitedRemaining
			continue
		default:
			params = &lim.Params
			st.Limit, st.HasLimit, st.Name = lim, true, lim.Name
			st.RequestsPerUnit, st.Unit = lim.RequestsPerUnit, lim.Unit
			d.keys = appendDescriptorKey(d.keys, r.Domain, lim, desc.Entries)
		}
		d.spans = append(d.spans, [2]int{start, len(d.keys)})
		shadow := lim != nil && lim.Shadow && desc.Limit == nil
		d.ops = append(d.ops, store.Op{Params: params, Cost: int64(cost), Shadow: shadow})
		d.opOf = append(d.opOf, i)
	}
	if len(d.ops) == 0 {
		return nil
	}
	// Keys and per-request params are pointed at once all appends are done.
	overrides := 0
	for i := range d.ops {
		d.ops[i].Key = d.keys[d.spans[i][0]:d.spans[i][1]:d.spans[i][1]]
		if d.ops[i].Params == nil {
			d.ops[i].Params = &d.params[overrides]
			overrides++
		}
	}
	d.algo = resize(d.algo, len(d.ops))
	if _, err := l.store.Apply(ctx, &store.Batch{Ops: d.ops}, d.algo); err != nil {
		if l.onError != nil {
			l.onError(err)
		}
		// Envoy-format limits have no on_store_error: they fail open, as Envoy's own
		// failure_mode_deny: false does.
		d.Degraded = true
		for i := range d.algo {
			d.algo[i] = algorithm.Result{Allowed: true, Remaining: d.ops[i].Params.Capacity()}
		}
	}
	for i, n := range d.opOf {
		st, a := &d.Statuses[n], &d.algo[i]
		st.Remaining = uint32(min(a.Remaining, unlimitedRemaining))
		st.ResetAfter = micros(a.ResetAfter)
		if !a.Allowed {
			st.ResetAfter = max(st.ResetAfter, micros(a.RetryAfter))
			if d.ops[i].Shadow {
				st.Shadow = true
				continue
			}
			st.OK, d.OK = false, false
		}
	}
	return nil
}

// appendDescriptorKey builds sl:@<domain>:<limit id>:<algorithm>:<key>:<value>...; the '@'
// keeps Envoy-format buckets apart from native rules, whose names cannot start with it.
func appendDescriptorKey(dst []byte, domain string, lim *envoyconf.Limit, entries []envoyconf.Entry) []byte {
	dst = append(dst, key.Prefix...)
	dst = append(dst, '@')
	dst = key.AppendPart(dst, domain)
	dst = key.AppendValue(dst, lim.ID)
	dst = key.AppendValue(dst, lim.Params.Kind.String())
	envoyconf.Match{Limit: lim}.CounterValues(entries, func(k, v string) {
		dst = key.AppendValue(key.AppendValue(dst, k), v)
	})
	return dst
}

func appendOverrideKey(dst []byte, domain string, desc *Descriptor) []byte {
	dst = append(dst, key.Prefix...)
	dst = append(dst, '@')
	dst = key.AppendPart(dst, domain)
	dst = append(dst, ":!override:"...)
	dst = strconv.AppendUint(dst, uint64(desc.Limit.RequestsPerUnit), 10)
	dst = append(dst, '/')
	dst = key.AppendPart(dst, strings.ToLower(desc.Limit.Unit))
	for _, e := range desc.Entries {
		dst = key.AppendValue(key.AppendValue(dst, e.Key), e.Value)
	}
	return dst
}

// unitPeriod maps an Envoy unit to its period: windows align to the Unix epoch, a month is 30
// days and a year 365.
func unitPeriod(unit string) (time.Duration, bool) {
	switch strings.ToLower(unit) {
	case "second":
		return time.Second, true
	case "minute":
		return time.Minute, true
	case "hour":
		return time.Hour, true
	case "day":
		return 24 * time.Hour, true
	case "week":
		return 7 * 24 * time.Hour, true
	case "month":
		return 30 * 24 * time.Hour, true
	case "year":
		return 365 * 24 * time.Hour, true
	}
	return 0, false
}
