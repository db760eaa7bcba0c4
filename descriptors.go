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
	// Quota is set for a limit in quota_mode. Such a descriptor over its limit is not OK, yet
	// the request is denied for it only when every quota_mode descriptor of the request is over
	// (see CheckDescriptors).
	Quota bool
	// Hits is what the request asked of the descriptor: its hits_addend, else the request's
	// (0 counting as 1). Envoy's reference counts its stats in hits.
	Hits uint64
}

// DescriptorDecision is the answer to a DescriptorRequest. Like Decision it keeps its buffers
// for reuse.
type DescriptorDecision struct {
	OK       bool
	Degraded bool
	// Exempt is set when an exemption matched the caller: every descriptor is OK with no
	// limit, and nothing was counted.
	Exempt bool
	// Banned is set when a ban override denied the request; it consumed nothing.
	Banned   bool
	Statuses []DescriptorStatus

	// req holds the attributes read from the descriptors; caller is req after the control
	// plane's assignments (Caller).
	req, assigned policy.Request
	caller        *policy.Request
	from          []Descriptor // the request's descriptors, for Caller
	cfg           *envoyconf.Config
	domain        string
	limiter       *Limiter
	attrKeys      [envoyAttributeCount]string
	remote        bool // remote_address sets ip
	mapped        bool // keys differ from the attributes' names
	overridden    bool // an override's target matched the caller (scratch holds them)
	scratch       policy.Scratch
	descs         []Descriptor      // the request's descriptors with an assigned tier
	entries       []envoyconf.Entry // their entries
	rewritten     []int             // the descriptors of descs rewritten
	replaced      []bool            // envoyconf.AppendReplaced's

	limits []*envoyconf.Limit
	ops    []store.Op
	opOf   []int    // ops[i] decides Statuses[opOf[i]]
	kinds  []opKind // kinds[i] says how ops[i] takes part in the decision
	batch  store.Batch
	algo   []algorithm.Result
	keys   []byte
	spans  [][2]int
	params []algorithm.Params

	// Burst counters of limits with an escalation (descriptors_control.go), and their keys,
	// the jth ending at bursts[j].end.
	bursts    []burstCounter
	burstKeys []byte
}

// Caller returns the request's attributes as read from its descriptors' entries, after the
// control plane's identity assignments: who the request is for violations, usage and the
// abuse detector. It is read on first need, from the request's descriptors, which must not
// have changed since the decision; it is valid until d is used again.
func (d *DescriptorDecision) Caller() *policy.Request {
	if d.caller == nil {
		d.readCaller()
	}
	return d.caller
}

// unlimitedRemaining is what Envoy reports as remaining for an unlimited descriptor.
const unlimitedRemaining = math.MaxUint32

// maxDescriptors bounds one request; Envoy sends a handful, so more is abuse, not traffic.
const maxDescriptors = 256

// opKind says how an op of a descriptor request takes part in its decision.
type opKind uint8

const (
	opLimit       opKind = iota // denies the request when over (unless a shadow)
	opQuota                     // quota_mode: denies only when every quota op is over
	opShadowQuota               // quota_mode and shadow_mode: a quota op that is never over
	opCounter                   // an escalation's burst counter: never denies
)

// CheckDescriptors decides an Envoy-style request: every descriptor's limit is applied in one
// atomic step, and a denied request consumes nothing from any of them.
//
// Limits in quota_mode follow Envoy's reference service: such a descriptor over its limit is
// OVER_LIMIT in its own status, but the request is denied only when every quota_mode
// descriptor is over (or, as always, when any other limit is). The quota descriptors that are
// over consume nothing; when the request is allowed, the others consume as usual.
//
// When the store fails, each limit follows its on_store_error (an extension of the format,
// see envoyconf.StoreErrorMode): open allows, closed denies, local decides with the Limiter's
// fallback store; the decision is marked Degraded.
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
	d.OK, d.Degraded, d.Exempt, d.Banned = true, false, false, false
	d.Statuses, d.limits, d.ops, d.opOf, d.kinds = d.Statuses[:0], d.limits[:0], d.ops[:0], d.opOf[:0], d.kinds[:0]
	d.keys, d.spans, d.params = d.keys[:0], d.spans[:0], d.params[:0]

	snap := l.policy.Load()
	cfg := snap.Envoy()
	descs, exempt := l.control(snap, cfg, r, d)
	if exempt {
		d.Exempt = true
		for range descs {
			d.Statuses = append(d.Statuses, DescriptorStatus{OK: true})
		}
		return nil
	}
	known := cfg != nil && cfg.HasDomain(r.Domain)
	for i := range descs {
		desc := &descs[i]
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
	var now time.Time // read once an override needs it
	escalates := false
	d.replaced = envoyconf.AppendReplaced(d.replaced, d.limits)
	replaced := d.replaced
	for i := range descs {
		desc, st, lim := &descs[i], &d.Statuses[i], d.limits[i]
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
		st.Hits = cost
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
			// Most requests match no override: they make no call for one.
			if d.overridden && l.overrideLimit(snap, lim, &now, st, d) {
				params = nil // in d.params, or banned
				if d.Banned && !st.OK {
					continue
				}
			} else if lim.Adaptive && l.adaptLimit(snap, lim, st, d) {
				params = nil // in d.params
			}
			escalates = escalates || lim.Escalation != nil
			d.keys = appendDescriptorKey(d.keys, r.Domain, lim, desc.Entries)
		}
		d.spans = append(d.spans, [2]int{start, len(d.keys)})
		// Global shadow mode covers per-request limits too: the reference answers OK whatever
		// was over.
		shadow := l.shadow || (lim != nil && lim.Shadow && desc.Limit == nil)
		kind := opLimit
		if l.quota || (lim != nil && lim.QuotaMode && desc.Limit == nil) {
			// As in the reference, a per-request limit override is in quota mode only under
			// the global QUOTA_MODE.
			st.Quota, kind = true, opQuota
			if shadow {
				kind = opShadowQuota
			}
		}
		d.ops = append(d.ops, store.Op{Params: params, Cost: int64(cost), Shadow: shadow})
		d.opOf = append(d.opOf, i)
		d.kinds = append(d.kinds, kind)
	}
	if d.Banned {
		// A banned request consumes nothing: its other limits are looked at, to report them.
		for i := range d.ops {
			d.ops[i].Cost = 0
		}
	} else if len(d.ops) == 0 && d.overridden && !l.shadow {
		// A ban with no limit of the request to deny: the caller is denied all the same.
		if now.IsZero() {
			now = l.now()
		}
		if _, _, ok := snap.BanFor(d.Caller(), now); ok {
			d.OK, d.Banned = false, true
		}
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
	limitOps := len(d.ops)
	if escalates && !d.Banned {
		l.burstCounters(d)
	}
	d.algo = resize(d.algo, len(d.ops))
	if _, err := l.storeStep(ctx, d); err != nil {
		return err
	}
	quotas, quotasOver := 0, 0
	for i, n := range d.opOf {
		st, a, op := &d.Statuses[n], &d.algo[i], &d.ops[i]
		st.Remaining = uint32(min(a.Remaining, unlimitedRemaining))
		st.ResetAfter = micros(a.ResetAfter)
		if d.kinds[i] != opLimit {
			quotas++
		}
		if a.Allowed {
			continue
		}
		st.ResetAfter = max(st.ResetAfter, micros(a.RetryAfter))
		switch d.kinds[i] {
		case opQuota:
			st.OK = false
			quotasOver++
		case opShadowQuota:
			st.Shadow = true
		default:
			if op.Shadow {
				st.Shadow = true
				continue
			}
			st.OK = false
		}
		if !op.Shadow {
			// The store denied the batch: nothing was consumed, so the request is denied.
			d.OK = false
		}
	}
	if quotas > 0 && quotasOver == quotas {
		d.OK = false
	}
	if len(d.ops) > limitOps && l.onBurst != nil && !d.Degraded {
		l.reportEnvoyBursts(d, limitOps)
	}
	return nil
}

// applyDescriptorOps applies ops to st in one batch, following quota_mode (kinds[i] for
// ops[i]) without ever consuming for a request it denies:
//
//   - A request whose only consuming ops are quota ops sends them as shadow ops: one over its
//     limit neither denies the batch nor consumes, and the request is denied, having consumed
//     nothing, only when all of them are over.
//   - A request with other consuming ops sends the quota ops as ordinary ops, so that a batch
//     the request is denied for consumes nothing. Only when some quota ops, not all, were over
//     and nothing else denied is the request allowed after all: the batch is then applied
//     again with those quota ops as shadows, a second round trip that only this case pays.
//
// It leaves in ops[i].Shadow how each op was last applied, which CheckDescriptors reads.
func applyDescriptorOps(ctx context.Context, st store.Store, b *store.Batch, ops []store.Op, kinds []opKind, res []algorithm.Result) error {
	quotas, consuming := 0, false
	for i := range ops {
		switch kinds[i] {
		case opLimit:
			consuming = consuming || ops[i].Cost > 0
		case opQuota, opShadowQuota:
			quotas++
		}
	}
	if quotas > 0 && !consuming {
		for i := range ops {
			if kinds[i] == opQuota {
				ops[i].Shadow = true
			}
		}
	}
	*b = store.Batch{Ops: ops}
	if _, err := st.Apply(ctx, b, res); err != nil {
		return err
	}
	if quotas == 0 || !consuming {
		return nil
	}
	over := 0
	for i := range ops {
		if res[i].Allowed || ops[i].Shadow {
			continue
		}
		if kinds[i] == opLimit {
			return nil // denied by a limit
		}
		over++
	}
	if over == 0 || over == quotas {
		return nil // allowed, or denied with every quota over
	}
	for i := range ops {
		if kinds[i] == opQuota && !res[i].Allowed {
			ops[i].Shadow = true
		}
	}
	// Burst counters counted the request already: they only look again, which reports what
	// the count left (reportEnvoyBursts reads whether they counted from burstCounter).
	for i := range ops {
		if kinds[i] == opCounter {
			ops[i].Cost = 0
		}
	}
	*b = store.Batch{Ops: ops}
	_, err := st.Apply(ctx, b, res)
	return err
}

// apply is an Envoy request's store step (batchForm), quota_mode included.
func (d *DescriptorDecision) apply(ctx context.Context, st store.Store) (bool, error) {
	return false, applyDescriptorOps(ctx, st, &d.batch, d.ops, d.kinds, d.algo)
}

// degrade decides the ops of a request the store could not, by each limit's on_store_error,
// with the native rules' degradeOps (batchForm). A quota op that is closed, or decided by the
// fallback, goes as a shadow: one over its limit is one more quota over, never a denial of the
// others (the quota verdict is taken over all ops); a request denied because every quota is
// over may then have counted its other limits in the local limiter, an imprecision of the
// degraded mode only.
func (d *DescriptorDecision) degrade(ctx context.Context, l *Limiter, cause error) error {
	d.Degraded = true
	descs := d.from
	modes := make([]store.ErrorMode, len(d.ops))
	for i, n := range d.opOf {
		mode := envoyconf.FailOpen
		if lim := d.limits[n]; lim != nil && descs[n].Limit == nil {
			mode = lim.OnStoreError
		} else if d.cfg != nil {
			// A per-request limit override: the mode in force where its entries lead.
			mode = d.cfg.StoreErrorMode(d.domain, descs[n].Entries)
		}
		modes[i] = mode
		if mode == store.FailClosed || (mode == store.FailLocal && l.fallback != nil) {
			d.ops[i].Shadow = d.ops[i].Shadow || d.kinds[i] == opQuota
		}
	}
	return l.degradeOps(ctx, d.ops, d.algo, func(i int) store.ErrorMode { return modes[i] }, cause)
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
