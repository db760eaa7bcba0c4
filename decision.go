package sluice

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// State grades a decision: normal < soft (allowed, past the soft threshold or inside the hard
// threshold's tolerance) < hard (denied).
type State uint8

// The states (docs/architecture.md, Thresholds and states).
const (
	StateNormal State = iota
	StateSoft
	StateHard
)

var stateNames = [...]string{"normal", "soft", "hard"}

func (s State) String() string { return stateNames[s] }

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Result is what one limit decided.
type Result struct {
	Rule      string
	Scope     string
	Algorithm algorithm.Kind
	Allowed   bool
	State     State
	// Limit is what the limit lets a caller spend at once (after tier, override and the hard
	// threshold): a bucket's burst, a window's limit. Remaining never exceeds it, so a client
	// can read remaining/limit as a fraction (DESIGN.md, Limits and algorithms).
	Limit int64
	// Quota and Period are the policy's rate: Quota units per Period (a bucket's refill, a
	// window's limit before the hard threshold), shown in RateLimit-Policy.
	Quota      int64
	Period     time.Duration
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	Delay      time.Duration
	Shadow     bool
	Reason     string
	// Warning is set while a warning override (escalation's first penalty) applies to the
	// limit's caller: the limit's allowed decisions are soft, and this says why.
	Warning string
}

// InFlight returns, for a concurrency limit, the leases it counts in flight: after this
// request when it took a slot, before it when it only looked; 0 for any other limit.
func (r *Result) InFlight() int64 {
	if r.Algorithm != algorithm.Concurrency {
		return 0
	}
	return max(0, r.Limit-r.Remaining)
}

// start sets r to the limit lim before it is decided. Field by field, not as a composite
// literal: the compiler builds a literal of this size on the stack and copies it, which costs a
// measurable part of a Check.
func (r *Result) start(lim *policy.Limit) {
	r.Rule, r.Scope, r.Algorithm, r.Shadow = lim.Rule.Name, lim.Rule.Scope, lim.Params.Kind, lim.Rule.Shadow
	r.Limit, r.Quota, r.Period = lim.Params.Capacity(), lim.Spec.Limit, lim.Spec.Period
	r.Allowed, r.State, r.Remaining, r.Reason, r.Warning = false, StateNormal, 0, "", ""
	r.ResetAfter, r.RetryAfter, r.Delay = 0, 0, 0
}

// Decision is the answer to one request. Its top-level fields are those of the deciding limit:
// the limit in the worst state (hard, then soft, then normal); among denials the longest wait,
// otherwise the least remaining.
//
// A Decision is filled in place and keeps its buffers, so a caller that reuses one per
// goroutine checks without allocating.
type Decision struct {
	Allowed    bool
	State      State
	Limit      int64
	Period     time.Duration
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	Delay      time.Duration
	Rule       string
	Scope      string
	// Shadow is set when a shadow limit would have denied a request that was allowed. A
	// denial never sets it: the answer describes the limit or ban that denied, and a shadow
	// limit never denies.
	Shadow bool
	// Exempt is set when the caller is exempt: allowed and not counted.
	Exempt bool
	// Replayed is set when the decision is the stored answer to an earlier request with the
	// same idempotency key.
	Replayed bool
	// Degraded is set when the store failed and the decision followed on_store_error.
	Degraded bool
	// HotKey is set when a hot key was decided in the process (hot-key mode) between syncs
	// with the shared store.
	HotKey bool
	// Anonymous is set when a limit keys on an identity attribute (identity, user, api_key or
	// ip) that the request lacks: it then shares that limit's one bucket with every request
	// lacking it. Counted in sluice_requests_without_identity_total.
	Anonymous bool
	Reason    string
	// Warning is the deciding limit's Result.Warning when the decision is allowed and soft:
	// the X-RateLimit-Warning of a caller under a warning override.
	Warning string
	// PolicyVersion is the version of the policy that decided.
	PolicyVersion string
	Results       []Result

	scratch policy.Scratch
	limits  []policy.Limit // the limits that apply, in scratch
	req     policy.Request // the request with its identity assignments (Snapshot.Assign)
	tenant  string         // the tenant and user decided for (Caller)
	user    string
	ops     []store.Op
	opLimit []int // ops[i] decides for Results[opLimit[i]]
	// counterLimit lists, for each counter op (escalation's burst counters, after the
	// limits' ops in ops), the index of its limit; counterKey holds their keys, the jth
	// ending at counterEnd[j].
	counterLimit, counterEnd []int
	counterKey               []byte
	algo                     []algorithm.Result
	batch                    store.Batch
	idem                     []byte
	fp                       []byte  // scratch for the idempotency fingerprint
	opAt                     []int64 // a reservation's: the instant each op was decided at
}

// reset clears the answer and keeps the buffers.
func (d *Decision) reset() {
	d.Allowed, d.State, d.Limit, d.Period, d.Remaining = false, StateNormal, 0, 0, 0
	d.ResetAfter, d.RetryAfter, d.Delay = 0, 0, 0
	d.Rule, d.Scope, d.Reason, d.PolicyVersion, d.Warning = "", "", "", "", ""
	d.Shadow, d.Exempt, d.Replayed, d.Degraded, d.HotKey, d.Anonymous = false, false, false, false, false, false
	d.Results, d.ops, d.opLimit, d.idem, d.opAt = d.Results[:0], d.ops[:0], d.opLimit[:0], d.idem[:0], d.opAt[:0]
}

// Caller returns the tenant and user the decision was made for: the request's own, or those
// the control plane assigned to its API key, which win over what a request claims.
func (d *Decision) Caller() (tenant, user string) { return d.tenant, d.user }

// Deciding returns the index in Results of the limit whose numbers the decision reports, or -1.
func (d *Decision) deciding() int {
	best := -1
	for i := range d.Results {
		r := &d.Results[i]
		if best < 0 {
			best = i
			continue
		}
		b := &d.Results[best]
		// Real limits speak before shadow ones.
		if r.Shadow != b.Shadow {
			if !r.Shadow {
				best = i
			}
			continue
		}
		switch {
		case r.State != b.State:
			// The worst state speaks: a denial before a warning, a warning before a normal
			// limit with less room, so X-RateLimit-Warning names the rule that warned.
			if r.State > b.State {
				best = i
			}
		case !r.Allowed:
			// Among denials, the longest wait; a denial with no retry (never fits) is longest.
			if waitRank(r) > waitRank(b) {
				best = i
			}
		case r.Remaining < b.Remaining:
			best = i
		}
	}
	return best
}

func waitRank(r *Result) time.Duration {
	if r.RetryAfter == 0 {
		return time.Duration(1<<63 - 1)
	}
	return r.RetryAfter
}

// stateOf grades an allowed result against its nominal capacity and thresholds.
func stateOf(spec *policy.Spec, p *algorithm.Params, r *algorithm.Result) State {
	if !r.Allowed {
		return StateHard
	}
	nominal := spec.Nominal()
	used := p.Capacity() - r.Remaining
	switch {
	case used > nominal:
		return StateSoft // inside the hard threshold's tolerance
	case spec.Soft > 0 && used*100 >= spec.Soft*nominal:
		return StateSoft
	}
	return StateNormal
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// ceilMillis rounds d up to whole milliseconds, so a caller that waits retry_after_ms is never
// early.
func ceilMillis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// AppendJSON appends the decision in the wire format of POST /v1/check (docs/architecture.md, Answers).
// Hand-written because it runs for every HTTP check: it allocates nothing and is several times
// faster than encoding/json with reflection.
func (d *Decision) AppendJSON(b []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"state":"`...)
	b = append(b, d.State.String()...)
	b = append(b, `","limit":`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(d.ResetAfter), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(d.RetryAfter), 10)
	b = append(b, `,"delay_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(d.Delay), 10)
	b = append(b, `,"rule":`...)
	b = appendJSONString(b, d.Rule)
	b = append(b, `,"scope":`...)
	b = appendJSONString(b, d.Scope)
	b = append(b, `,"shadow":`...)
	b = strconv.AppendBool(b, d.Shadow)
	b = append(b, `,"exempt":`...)
	b = strconv.AppendBool(b, d.Exempt)
	if d.Replayed {
		b = append(b, `,"replayed":true`...)
	}
	if d.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	if d.HotKey {
		b = append(b, `,"hot_key":true`...)
	}
	if d.Anonymous {
		b = append(b, `,"anonymous":true`...)
	}
	if d.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, d.Reason)
	}
	if d.Warning != "" {
		b = append(b, `,"warning":`...)
		b = appendJSONString(b, d.Warning)
	}
	if d.PolicyVersion != "" {
		b = append(b, `,"policy_version":`...)
		b = appendJSONString(b, d.PolicyVersion)
	}
	b = append(b, `,"results":[`...)
	for i := range d.Results {
		r := &d.Results[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"rule":`...)
		b = appendJSONString(b, r.Rule)
		b = append(b, `,"scope":`...)
		b = appendJSONString(b, r.Scope)
		b = append(b, `,"algorithm":"`...)
		b = append(b, r.Algorithm.String()...)
		b = append(b, `","allowed":`...)
		b = strconv.AppendBool(b, r.Allowed)
		b = append(b, `,"state":"`...)
		b = append(b, r.State.String()...)
		b = append(b, `","limit":`...)
		b = strconv.AppendInt(b, r.Limit, 10)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, r.Remaining, 10)
		b = append(b, `,"reset_after_ms":`...)
		b = strconv.AppendInt(b, ceilMillis(r.ResetAfter), 10)
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, ceilMillis(r.RetryAfter), 10)
		if r.Algorithm == algorithm.Concurrency {
			b = append(b, `,"in_flight":`...)
			b = strconv.AppendInt(b, r.InFlight(), 10)
		}
		if r.Delay > 0 {
			b = append(b, `,"delay_ms":`...)
			b = strconv.AppendInt(b, ceilMillis(r.Delay), 10)
		}
		if r.Shadow {
			b = append(b, `,"shadow":true`...)
		}
		if r.Reason != "" {
			b = append(b, `,"reason":`...)
			b = appendJSONString(b, r.Reason)
		}
		if r.Warning != "" {
			b = append(b, `,"warning":`...)
			b = appendJSONString(b, r.Warning)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Attribute values were checked for UTF-8 on
// the way in; control characters, quotes and backslashes are escaped here.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
