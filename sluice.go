// Package sluice is a rate limiter for API quotas: every classic algorithm, a policy of rules,
// tiers, overrides and exemptions, and stores from process memory to Redis Cluster.
//
// A Limiter resolves a request's attributes against the policy into limits, applies them all in
// one atomic step of its store, and returns a Decision. See the httplimit package for net/http
// middleware and cmd/sluice for the service.
package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store"
)

// Request is the attributes of one request to rate-limit.
type Request = policy.Request

// Store applies batches of limits atomically: see store.Store.
type Store = store.Store

// DefaultIdempotencyTTL is how long an allowed decision is remembered for its idempotency key.
const DefaultIdempotencyTTL = 5 * time.Minute

// ErrIdempotencyMismatch is returned by Check when the request's idempotency key was used,
// within its TTL, by a request with other limits (another endpoint, tier or rule set) or another
// cost. The request consumes nothing. Servers answer it with 422 (HTTP) or FailedPrecondition
// (gRPC), naming idempotency_key; it is bad input, though not policy.ErrInvalid, since the same
// request with a fresh key is valid.
var ErrIdempotencyMismatch = store.ErrIdempotencyMismatch

// Limiter decides requests. It is safe for any number of goroutines; SetPolicy swaps the policy
// without blocking checks.
type Limiter struct {
	store    Store
	fallback Store // on_store_error: local
	policy   atomic.Pointer[policy.Snapshot]
	now      func() time.Time
	idemTTL  time.Duration
	log      *slog.Logger
	onError  func(error)
	onBurst  func(Burst)
	share    int64 // on_store_error: local divides limits by this many nodes
	shadow   bool  // every limit is a shadow: decided and reported, never denying
	quota    bool  // every Envoy-format limit is in quota_mode (WithEnvoyQuotaMode)
	// envoyAttrs names the descriptor entries Envoy requests' attributes are read from, where
	// a domain's file does not (WithEnvoyAttributes).
	envoyAttrs envoyconf.AttributeMap
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the wall clock that override expiry is read against (the store keeps its own
// clock for the algorithms).
func WithClock(now func() time.Time) Option { return func(l *Limiter) { l.now = now } }

// WithIdempotencyTTL sets how long allowed decisions are remembered by idempotency key.
func WithIdempotencyTTL(d time.Duration) Option { return func(l *Limiter) { l.idemTTL = d } }

// WithLogger sets the logger.
func WithLogger(log *slog.Logger) Option { return func(l *Limiter) { l.log = log } }

// WithFallback sets the store that rules with on_store_error: local use when the main store
// fails: typically a memory store, so each node limits on its own until the store is back.
func WithFallback(s Store) Option { return func(l *Limiter) { l.fallback = s } }

// WithLocalShare divides the limits of on_store_error: local rules by the expected number of
// nodes, so that while the shared store is down the fleet together admits about the limit
// rather than each node admitting all of it.
func WithLocalShare(nodes int) Option { return func(l *Limiter) { l.share = int64(max(1, nodes)) } }

// WithShadow puts the Limiter in global shadow mode: every limit is decided, counted and
// reported as a shadow rule is (Decision.Shadow, a limit's Result.Shadow), but no request is
// denied, by a limit, a ban or a failing store. A limit over its limit consumes nothing, as
// a shadow rule's does. It is the reference Envoy service's SHADOW_MODE: a way to roll out a
// policy and watch what it would deny.
func WithShadow() Option { return func(l *Limiter) { l.shadow = true } }

// WithEnvoyQuotaMode puts every limit of an Envoy-format request (CheckDescriptors) in
// quota_mode, per-request limits included: a descriptor over its limit is OVER_LIMIT in its
// status, and the request is denied only when every such descriptor is over. It is the
// reference Envoy service's QUOTA_MODE. Native checks are not affected.
func WithEnvoyQuotaMode() Option { return func(l *Limiter) { l.quota = true } }

// WithStoreErrorHook is called with every store error, for metrics.
func WithStoreErrorHook(f func(error)) Option { return func(l *Limiter) { l.onError = f } }

// WithBurstHook is called, during the Check that found it, with every burst that a rule's
// escalation detects: once per caller, rule and window, fleet-wide (a shared store counts for
// every node). It must not block: hand the burst to a queue and return.
func WithBurstHook(f func(Burst)) Option { return func(l *Limiter) { l.onBurst = f } }

// WithEnvoyAttributes reads the attributes of Envoy requests (tenant, user, api_key, ip,
// endpoint, method, tier) from the descriptor entries m names, where the domain's own
// attributes: mapping does not name them (the --envoy-attributes flag).
func WithEnvoyAttributes(m envoyconf.AttributeMap) Option {
	return func(l *Limiter) { l.envoyAttrs = m }
}

// Burst is a caller that sent more than a rule's escalation threshold within its window: the
// request that made it Threshold+1. Escalation names the caller by its API key, or by its user
// and tenant (User with Tenant, APIKey empty).
type Burst struct {
	Rule                 string
	Tenant, User, APIKey string
	Window               time.Duration
	Threshold            int64
	Penalty              time.Duration
}

// ErrNoPolicy is returned by New and SetPolicy for a nil policy.
var ErrNoPolicy = errors.New("sluice: no policy (nil *policy.Snapshot); load one with policy.Load")

// New returns a Limiter over st with policy p. Both are required: a nil store or policy is an
// error here rather than a panic at the first Check.
func New(st Store, p *policy.Snapshot, opts ...Option) (*Limiter, error) {
	if st == nil {
		return nil, errors.New("sluice: no store (nil Store); use memory.New() for one process")
	}
	if p == nil {
		return nil, ErrNoPolicy
	}
	l := &Limiter{store: st, now: time.Now, idemTTL: DefaultIdempotencyTTL, log: slog.Default()}
	for _, o := range opts {
		o(l)
	}
	l.policy.Store(p)
	return l, nil
}

// SetPolicy swaps the policy; checks under way finish with the one they started with. A nil
// policy is refused and the running one kept.
func (l *Limiter) SetPolicy(p *policy.Snapshot) error {
	if p == nil {
		return ErrNoPolicy
	}
	l.policy.Store(p)
	return nil
}

// Policy returns the policy in force.
func (l *Limiter) Policy() *policy.Snapshot { return l.policy.Load() }

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Check decides r and consumes its cost from every limit that applies, all or nothing, filling
// d. An error is bad input (it wraps policy.ErrInvalid), an idempotency key reused for another
// request (ErrIdempotencyMismatch) or, with no fallback, a store failure.
func (l *Limiter) Check(ctx context.Context, r *Request, d *Decision) error {
	cost := r.Cost
	if cost == 0 {
		cost = 1
	}
	return l.decide(ctx, r, d, cost)
}

// Quota reports r's limits without consuming anything.
func (l *Limiter) Quota(ctx context.Context, r *Request, d *Decision) error {
	return l.decide(ctx, r, d, 0)
}

func (l *Limiter) decide(ctx context.Context, r *Request, d *Decision, cost int64) error {
	return l.decideLease(ctx, r, d, cost, nil)
}

// leaseAsk is what a reservation asks of a decision: the lease id that names the slots its
// concurrency limits take, and their ttl (µs).
type leaseAsk struct {
	slot []byte
	ttl  int64
}

// decideLease is decide; a lease asks the store to decide in the shared store, to report
// each op's instant (store.Batch.Lease, OpAt) and to take a slot of each concurrency limit,
// for a reservation.
func (l *Limiter) decideLease(ctx context.Context, r *Request, d *Decision, cost int64, lease *leaseAsk) error {
	if err := r.Validate(); err != nil {
		return err
	}
	snap := l.policy.Load()
	// The tenant, user and tier assigned by the control plane win over the ones r claims.
	r, exempt := admit(snap, r, &d.req)
	d.reset()
	d.PolicyVersion, d.tenant, d.user = snap.Version, r.Tenant, r.User
	if exempt {
		d.Allowed, d.Exempt = true, true
		return nil
	}
	// The clock is read for override expiry only if an override matches r.
	limits, now := snap.ResolveNow(r, l.now, &d.scratch)
	d.limits = limits
	if len(limits) == 0 {
		d.Allowed = true
		if snap.HasOverrides() {
			now = l.now()
			if until, reason, ok := snap.BanFor(r, now); ok {
				if l.shadow {
					d.Shadow = true // reported, not enforced
				} else {
					l.ban(d, until.Sub(now), reason, "", "")
				}
			}
		}
		return nil
	}
	banned := false
	for i := range limits {
		lim := &limits[i]
		if lim.Banned && !lim.Rule.Shadow && !l.shadow {
			banned = true
		}
		if lim.Rule.MissesIdentity(r) {
			d.Anonymous = true
		}
	}
	// Escalation and warnings cost the checks of a policy without them one test each.
	bursts := 0
	if snap.Escalates() && !banned {
		bursts = d.counterKeys(limits, r)
	}
	opCost := cost
	if banned {
		opCost = 0 // a banned request consumes nothing; look, to report the other limits
	}
	// Results, ops and their index are filled in place: they are reused buffers, and appending
	// composite literals of this size would build each one and copy it.
	d.Results = resize(d.Results, len(limits))
	d.ops = resize(d.ops, len(limits)+bursts)
	d.opLimit = resize(d.opLimit, len(limits))
	nops := 0
	for i := range limits {
		lim, res := &limits[i], &d.Results[i]
		res.start(lim)
		res.Shadow = res.Shadow || l.shadow
		// Under a ban that denies, a shadow rule reports its own numbers (a look): the ban
		// denied, and a shadow limit never does, so its result must not say it did.
		if lim.Banned && !(banned && lim.Rule.Shadow && !l.shadow) {
			res.State, res.RetryAfter = StateHard, lim.BannedUntil().Sub(now)
			reason, _, _ := lim.OverrideReason()
			res.Reason = "banned: " + reason
			continue
		}
		op := &d.ops[nops]
		op.Key, op.Params, op.Cost, op.Shadow, op.Counter = lim.Key, lim.Params, opCost, lim.Rule.Shadow || l.shadow, false
		op.Slot, op.SlotTTL = nil, 0
		if lease != nil && lim.Params.Kind == algorithm.Concurrency {
			op.Slot, op.SlotTTL = lease.slot, lease.ttl // the reservation's slot
		}
		d.opLimit[nops] = i
		nops++
	}
	d.opLimit = d.opLimit[:nops]
	if bursts > 0 {
		nops = d.addCounters(limits, nops, opCost)
	}
	d.ops = d.ops[:nops]
	d.algo = resize(d.algo, nops)
	d.batch = store.Batch{Ops: d.ops}
	if lease != nil {
		d.opAt = resize(d.opAt, len(d.ops))
		d.batch.Lease, d.batch.OpAt = true, d.opAt
	}
	if r.IdempotencyKey != "" && cost > 0 && !banned {
		d.idem = appendIdempotencyKey(d.idem[:0], r)
		d.batch.IdempotencyKey, d.batch.IdempotencyTTL = d.idem, l.idemTTL
		// The record is bound to what this request asks of the store, so that the key replays
		// only a retry of it, not another cost, endpoint or rule set.
		d.batch.IdempotencyFingerprint, d.fp = store.FingerprintOf(d.ops, d.fp)
	}
	if len(d.ops) > 0 {
		replayed, err := l.storeStep(ctx, d)
		if err != nil {
			return err
		}
		d.Replayed, d.HotKey = replayed, d.batch.HotKey
	}
	for i, n := range d.opLimit {
		lim, res, a := &limits[n], &d.Results[n], &d.algo[i]
		if d.Degraded && res.Reason != "" {
			continue // decided by degrade
		}
		res.Allowed = a.Allowed
		res.State = stateOf(lim.Spec, lim.Params, a)
		res.Remaining = a.Remaining
		res.ResetAfter, res.RetryAfter, res.Delay = micros(a.ResetAfter), micros(a.RetryAfter), micros(a.Delay)
		if a.Reason != algorithm.ReasonNone {
			res.Reason = a.Reason.String()
		}
	}
	if snap.Warns() {
		warn(limits, d)
	}
	if bursts > 0 && l.onBurst != nil && !d.Degraded && !d.Replayed {
		l.reportBursts(r, limits, d)
	}
	l.summarize(d)
	if d.Allowed && d.State == StateSoft && d.Warning == "" && snap.Warns() {
		d.Warning = d.warning()
	}
	return nil
}

// counterKeys builds, in d.counterKey, the keys of the counter ops that r sends: one per limit
// whose rule has an escalation that can name r's caller (escalation's burst counters). It
// returns how many. A banned request sends none: it reaches the store only to look.
//
//go:noinline
func (d *Decision) counterKeys(limits []policy.Limit, r *Request) int {
	d.counterLimit, d.counterKey, d.counterEnd = d.counterLimit[:0], d.counterKey[:0], d.counterEnd[:0]
	for i := range limits {
		var ok bool
		if d.counterKey, ok = d.scratch.AppendBurstKey(d.counterKey, limits[i].Rule, r); ok {
			d.counterLimit, d.counterEnd = append(d.counterLimit, i), append(d.counterEnd, len(d.counterKey))
		}
	}
	return len(d.counterLimit)
}

// warn makes the allowed results of limits under a warning override soft, with the warning.
//
//go:noinline
func warn(limits []policy.Limit, d *Decision) {
	for _, n := range d.opLimit {
		lim, res := &limits[n], &d.Results[n]
		if lim.Warning != "" && res.Allowed {
			res.State, res.Warning = max(res.State, StateSoft), lim.Warning
		}
	}
}

// warning returns the first warning of d's soft results: the decision's X-RateLimit-Warning
// when its deciding limit, the one with the least room, is soft for another reason.
func (d *Decision) warning() string {
	for i := range d.Results {
		if r := &d.Results[i]; r.State == StateSoft && r.Warning != "" && !r.Shadow {
			return r.Warning
		}
	}
	return ""
}

// addCounters appends to d.ops, after the limits' nops ops, the counter ops whose keys
// counterKeys built, and returns the new count. A counter counts requests, not their cost: 1
// for a request that consumes, 0 for a look.
//
//go:noinline
func (d *Decision) addCounters(limits []policy.Limit, nops int, opCost int64) int {
	cost := int64(0)
	if opCost > 0 {
		cost = 1
	}
	start := 0
	for j, n := range d.counterLimit {
		end := d.counterEnd[j]
		op := &d.ops[nops]
		op.Key, op.Params, op.Cost, op.Shadow, op.Counter = d.counterKey[start:end:end], limits[n].Rule.BurstParams(), cost, false, true
		op.Slot, op.SlotTTL = nil, 0
		start = end
		nops++
	}
	return nops
}

// reportBursts hands every burst that the counter ops found to the burst hook.
func (l *Limiter) reportBursts(r *Request, limits []policy.Limit, d *Decision) {
	first := len(d.opLimit)
	for j, n := range d.counterLimit {
		a, op := &d.algo[first+j], &d.ops[first+j]
		if !policy.BurstOver(a.Allowed, a.Remaining, op.Cost) {
			continue
		}
		rule := limits[n].Rule
		window, threshold, penalty, _ := rule.Escalation()
		b := Burst{Rule: rule.Name, Window: window, Threshold: threshold, Penalty: penalty}
		if r.APIKey != "" {
			b.APIKey = r.APIKey
		} else {
			b.Tenant, b.User = r.Tenant, r.User
		}
		l.onBurst(b)
	}
}

// summarize sets the top-level fields from the deciding limit.
func (l *Limiter) summarize(d *Decision) {
	d.Allowed = true
	for i := range d.Results {
		r := &d.Results[i]
		// A ban reports only a wait; the limit is restored no sooner than the caller may
		// retry, and clients read reset_after as that bound.
		r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
		if r.Shadow {
			if !r.Allowed {
				d.Shadow = true
			}
			continue
		}
		if !r.Allowed {
			d.Allowed = false
		}
		d.State = max(d.State, r.State)
	}
	if !d.Allowed {
		d.Shadow = false // the top-level fields describe what denied, never a shadow limit
	}
	if i := d.deciding(); i >= 0 {
		r := &d.Results[i]
		d.Limit, d.Period, d.Remaining = r.Limit, r.Period, r.Remaining
		d.ResetAfter, d.Delay, d.Rule, d.Scope = r.ResetAfter, r.Delay, r.Rule, r.Scope
		if !d.Allowed {
			d.RetryAfter, d.Reason = r.RetryAfter, r.Reason
		} else if r.State == StateSoft {
			d.Warning = r.Warning
		}
	}
}

func (l *Limiter) ban(d *Decision, wait time.Duration, reason, rule, scope string) {
	d.Allowed, d.State, d.RetryAfter, d.ResetAfter = false, StateHard, wait, wait
	d.Reason, d.Rule, d.Scope = "banned: "+reason, rule, scope
}

// apply is a native request's store step (batchForm).
func (d *Decision) apply(ctx context.Context, st store.Store) (bool, error) {
	return st.Apply(ctx, &d.batch, d.algo)
}

// degrade decides the limit ops of a batch the store could not, by each rule's
// on_store_error (batchForm).
func (d *Decision) degrade(ctx context.Context, l *Limiter, cause error) error {
	d.Degraded = true
	limits := d.limits
	mode := func(i int) store.ErrorMode { return limits[d.opLimit[i]].Rule.OnStoreError }
	if err := l.degradeOps(ctx, d.ops[:len(d.opLimit)], d.algo, mode, cause); err != nil {
		return err
	}
	for i, n := range d.opLimit {
		if mode(i) == store.FailClosed {
			res := &d.Results[n]
			res.Allowed, res.State, res.Reason = false, StateHard, "store unavailable (on_store_error: closed)"
		}
	}
	return nil
}

// degradeOps decides each of ops that the store could not, into res, by mode(i), for native
// and Envoy requests alike: FailOpen allows at the limit's capacity; FailClosed denies (a
// zero result); FailLocal asks the fallback store, each node for its share of the limit, and
// is FailOpen when the Limiter has no fallback. The fallback's batch is rare and off the hot
// path: it may allocate.
func (l *Limiter) degradeOps(ctx context.Context, ops []store.Op, res []algorithm.Result, mode func(i int) store.ErrorMode, cause error) error {
	var local []int
	for i := range ops {
		switch mode(i) {
		case store.FailClosed:
			res[i] = algorithm.Result{}
		case store.FailLocal:
			if l.fallback != nil {
				local = append(local, i)
				continue
			}
			fallthrough
		default:
			res[i] = algorithm.Result{Allowed: true, Remaining: ops[i].Params.Capacity()}
		}
	}
	if len(local) == 0 {
		return nil
	}
	sub := make([]store.Op, len(local))
	params := make([]algorithm.Params, len(local))
	for j, i := range local {
		sub[j] = ops[i]
		if p := sub[j].Params; l.share > 1 {
			// Each node's part, at least 1 so every node still serves someone.
			shared, err := algorithm.NewParams(p.Kind, max(1, p.Limit/l.share), max(1, p.Burst/l.share), time.Duration(p.Period)*time.Microsecond)
			if cal := p.Calendar(); cal != nil && err == nil {
				shared, err = shared.WithCalendar(cal)
			}
			if p.Drains() && err == nil {
				shared, err = shared.WithDrain()
			}
			if err == nil {
				params[j] = shared
				sub[j].Params = &params[j]
			}
		}
	}
	got := make([]algorithm.Result, len(sub))
	if _, err := l.fallback.Apply(ctx, &store.Batch{Ops: sub}, got); err != nil {
		return fmt.Errorf("store: %w; local fallback: %v", cause, err)
	}
	for j, i := range local {
		res[i] = got[j]
	}
	return nil
}

// Reset restores to full every bucket that r addresses, or only those of rule when it is set,
// and returns how many keys it reset.
func (l *Limiter) Reset(ctx context.Context, r *Request, rule string) (int, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	snap := l.policy.Load()
	var assigned Request
	r = snap.Assign(r, &assigned)
	if rule != "" && snap.Rule(rule) == nil {
		return 0, &policy.FieldError{Field: "rule", Msg: fmt.Sprintf("no rule named %q", rule)}
	}
	var sc policy.Scratch
	var keys [][]byte
	for _, lim := range snap.Resolve(r, time.Time{}, &sc) {
		if rule == "" || lim.Rule.Name == rule {
			keys = append(keys, lim.Key)
		}
	}
	if len(keys) == 0 {
		if rule != "" {
			return 0, &policy.FieldError{Field: "rule", Msg: fmt.Sprintf("rule %q does not apply to these attributes (its match filters miss them), so there is nothing of it to reset", rule)}
		}
		return 0, nil
	}
	if err := l.store.Reset(ctx, keys); err != nil {
		return 0, fmt.Errorf("reset: %w", err)
	}
	return len(keys), nil
}

// Close closes the store and the fallback.
func (l *Limiter) Close() error {
	err := l.store.Close()
	if l.fallback != nil {
		err = errors.Join(err, l.fallback.Close())
	}
	return err
}

// resize returns s with length n, reusing its array when it is big enough; the elements are
// for the caller to overwrite.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// appendIdempotencyKey scopes the caller's key to its tenant and identity, so that two callers
// choosing the same key do not share a decision.
func appendIdempotencyKey(dst []byte, r *Request) []byte {
	dst = append(dst, key.Prefix...)
	dst = append(dst, "idem"...)
	kind, id := r.Identity()
	if kind != 0 {
		dst = key.AppendTag(dst, kind, id)
	}
	dst = key.AppendValue(dst, r.Tenant)
	return key.AppendValue(dst, r.IdempotencyKey)
}
