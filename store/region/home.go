package region

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// Limits on what a peer may send, so a bad or hostile message is refused whole.
const (
	maxKeyLen   = 4096
	maxCost     = 1 << 30
	maxDecideOp = 64
	// maxIdempotencyTTL bounds how long a home region keeps a forwarded batch's record.
	maxIdempotencyTTL = 24 * time.Hour
)

// Decide applies the ops of rules homed in this region for another region, as the transport
// received them (the other region's applyHome). The request is checked whole first: a field
// that does not check is a *FieldError naming it, and nothing is applied. An idempotency key
// used before for other ops is store.ErrIdempotencyMismatch; a failing store, an error
// saying so.
func (r *Region) Decide(ctx context.Context, req *DecideRequest) (*DecideResponse, error) {
	if req.Region != r.cfg.Name {
		return nil, invalid("region", "this is region %q, not %q", r.cfg.Name, req.Region)
	}
	if n := len(req.Ops); n == 0 || n > maxDecideOp {
		return nil, invalid("ops", "must hold 1 to %d ops", maxDecideOp)
	}
	rs := r.rulesNow()
	ops := make([]store.Op, len(req.Ops))
	params := make([]algorithm.Params, len(ops))
	for i := range req.Ops {
		o := &req.Ops[i]
		field := func(name string) string { return fmt.Sprintf("ops[%d].%s", i, name) }
		if len(o.Key) == 0 || len(o.Key) > maxKeyLen {
			return nil, invalid(field("key"), "must be 1 to %d bytes", maxKeyLen)
		}
		info := rs.byHead[string(headOf(o.Key))]
		if info == nil || info.mode != policy.RegionHome || info.home != r.cfg.Name {
			return nil, invalid(field("key"), "not a key of a rule with regions: home:%s here", r.cfg.Name)
		}
		kind, err := algorithm.ParseKind(o.Algorithm)
		if err != nil {
			return nil, invalid(field("algorithm"), "%v", err)
		}
		if o.PeriodUs <= 0 || o.PeriodUs > algorithm.MaxPeriod.Microseconds() {
			return nil, invalid(field("period_us"), "must be from 1 to %d", algorithm.MaxPeriod.Microseconds())
		}
		p, err := algorithm.NewParams(kind, o.Limit, o.Burst, time.Duration(o.PeriodUs)*time.Microsecond)
		if err != nil {
			return nil, invalid(field("limit"), "%v", err)
		}
		if o.Cost < 0 || o.Cost > maxCost {
			return nil, invalid(field("cost"), "must be from 0 to %d", maxCost)
		}
		params[i] = p
		ops[i] = store.Op{Key: o.Key, Params: &params[i], Cost: o.Cost, Shadow: o.Shadow}
	}
	b := &store.Batch{Ops: ops}
	if k := req.IdempotencyKey; len(k) > 0 {
		ttl := time.Duration(req.IdempotencyTTLMs) * time.Millisecond
		switch {
		case len(k) > maxKeyLen:
			return nil, invalid("idempotency_key", "must be at most %d bytes", maxKeyLen)
		case ttl <= 0 || ttl > maxIdempotencyTTL:
			return nil, invalid("idempotency_ttl_ms", "must be from 1 to %d with an idempotency_key", maxIdempotencyTTL.Milliseconds())
		}
		b.IdempotencyKey, b.IdempotencyTTL = homeIdempotencyKey(k), ttl
		// Bound to what is decided here, the same whichever region forwards the retry.
		b.IdempotencyFingerprint, _ = store.FingerprintOf(ops, nil)
	}
	results := make([]algorithm.Result, len(ops))
	replayed, err := r.inner.Apply(ctx, b, results)
	if errors.Is(err, store.ErrIdempotencyMismatch) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("home region %s: store: %w", r.cfg.Name, err)
	}
	resp := &DecideResponse{Replayed: replayed, Results: make([]OpResult, len(results))}
	for i, a := range results {
		resp.Results[i] = OpResult{Allowed: a.Allowed, CostExceedsCapacity: a.Reason == algorithm.ReasonCostExceedsCapacity,
			Remaining: a.Remaining, ResetAfterUs: a.ResetAfter, RetryAfterUs: a.RetryAfter, DelayUs: a.Delay}
	}
	return resp, nil
}

// applyHome decides a batch with ops of rules homed in other regions: those first, in their
// home (one round trip each home), then the rest here, looking only (consuming nothing) when a
// home denied. A request the home admitted and a local limit then denies stays counted at
// home: the error is on the side of admitting less.
func (r *Region) applyHome(ctx context.Context, b *store.Batch, results []algorithm.Result, sc *scratch, rs *ruleSet) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	denied, homeReplayed := false, false
	isHome := make([]bool, len(b.Ops))
	for len(sc.home) > 0 {
		home := rs.byHead[string(headOf(b.Ops[sc.home[0]].Key))].home
		var these, rest []int
		for _, i := range sc.home {
			if rs.byHead[string(headOf(b.Ops[i].Key))].home == home {
				these = append(these, i)
			} else {
				rest = append(rest, i)
			}
		}
		sc.home = rest
		pi, ok := r.byName[home]
		if !ok || r.peers[pi].link == nil {
			return false, fmt.Errorf("%w: region %s: %w", store.ErrUnavailable, home, errNoPeer)
		}
		req := &DecideRequest{Region: home, Ops: make([]DecideOp, len(these))}
		for j, i := range these {
			op := &b.Ops[i]
			req.Ops[j] = DecideOp{Key: op.Key, Algorithm: op.Params.Kind.String(), Limit: op.Params.Limit, Burst: op.Params.Burst,
				PeriodUs: op.Params.Period, Cost: op.Cost, Shadow: op.Shadow}
			if denied {
				req.Ops[j].Cost = 0
			}
		}
		if !denied && len(b.IdempotencyKey) > 0 {
			req.IdempotencyKey, req.IdempotencyTTLMs = b.IdempotencyKey, max(1, b.IdempotencyTTL.Milliseconds())
		}
		resp, err := r.peers[pi].link.Decide(ctx, req)
		if err == nil && len(resp.Results) != len(these) {
			err = errors.New("answer holds the wrong number of results")
		}
		if errors.Is(err, store.ErrIdempotencyMismatch) {
			return false, store.ErrIdempotencyMismatch
		}
		if err != nil {
			return false, fmt.Errorf("%w: home region %s: %w", store.ErrUnavailable, home, err)
		}
		for j, i := range these {
			a := &resp.Results[j]
			results[i] = algorithm.Result{Allowed: a.Allowed, Remaining: a.Remaining, ResetAfter: a.ResetAfterUs,
				RetryAfter: a.RetryAfterUs, Delay: a.DelayUs}
			if a.CostExceedsCapacity {
				results[i].Reason = algorithm.ReasonCostExceedsCapacity
			}
			if !a.Allowed && !b.Ops[i].Shadow {
				denied = true
			}
			homeReplayed = resp.Replayed
			isHome[i] = true
		}
	}
	// The rest of the batch, here.
	local := &store.Batch{}
	var idx []int
	for i := range b.Ops {
		if isHome[i] {
			continue
		}
		op := b.Ops[i]
		if denied {
			op.Cost = 0
		}
		local.Ops = append(local.Ops, op)
		idx = append(idx, i)
	}
	if !denied {
		local.IdempotencyKey, local.IdempotencyTTL, local.IdempotencyFingerprint = b.IdempotencyKey, b.IdempotencyTTL, b.IdempotencyFingerprint
	}
	if len(local.Ops) == 0 {
		return homeReplayed, nil
	}
	res := make([]algorithm.Result, len(local.Ops))
	replayed, err := r.inner.Apply(ctx, local, res)
	if err != nil {
		return false, err
	}
	for j, i := range idx {
		results[i] = res[j]
	}
	b.HotKey = local.HotKey
	r.fixResults(b, results, sc, r.nowMicros())
	return replayed, nil
}

// homeIdempotencyKey is where a home region keeps the record of a forwarded batch: apart from
// the record of the whole request, which a retry sent to the home region itself would make
// with other ops.
func homeIdempotencyKey(k []byte) []byte {
	return key.AppendValue(k[:len(k):len(k)], "home")
}
