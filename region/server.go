package region

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/algorithm"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
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

// Register adds the sluice.v1.Regions service to s.
func (r *Region) Register(s *grpc.Server) { sluicev1.RegisterRegionsServer(s, &server{r: r}) }

type server struct {
	sluicev1.UnimplementedRegionsServer
	r *Region
}

func invalid(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// Sync merges a peer's counts. The message is checked whole before anything is merged. It is
// also queued for the region's inbox, when its store keeps one, so that the region's other
// nodes learn it too; the call never waits for that.
func (s *server) Sync(ctx context.Context, req *sluicev1.SyncRequest) (*sluicev1.SyncResponse, error) {
	r := s.r
	if err := r.authorize(ctx); err != nil {
		return nil, err
	}
	pi, counts, err := r.checkSync(req)
	if err != nil {
		return nil, err
	}
	now := r.nowMicros()
	r.postInbox(req, now)
	r.receive(pi, counts, now)
	p := r.peers[pi]
	p.stale.arrived(req.GetSentAtUs(), now)
	storeMax(&p.fromPeer, now)
	storeMax(&p.heard, now)
	return &sluicev1.SyncResponse{Region: r.cfg.Name, SentAtUs: req.GetSentAtUs()}, nil
}

// Decide applies the ops of rules homed in this region for another region.
func (s *server) Decide(ctx context.Context, req *sluicev1.DecideRequest) (*sluicev1.DecideResponse, error) {
	r := s.r
	if err := r.authorize(ctx); err != nil {
		return nil, err
	}
	if req.GetRegion() != r.cfg.Name {
		return nil, invalid("region", "this is region %q, not %q", r.cfg.Name, req.GetRegion())
	}
	if n := len(req.GetOps()); n == 0 || n > maxDecideOp {
		return nil, invalid("ops", "must hold 1 to %d ops", maxDecideOp)
	}
	rs := r.rulesNow()
	ops := make([]store.Op, len(req.GetOps()))
	params := make([]algorithm.Params, len(ops))
	for i, o := range req.GetOps() {
		field := func(name string) string { return fmt.Sprintf("ops[%d].%s", i, name) }
		if len(o.GetKey()) == 0 || len(o.GetKey()) > maxKeyLen {
			return nil, invalid(field("key"), "must be 1 to %d bytes", maxKeyLen)
		}
		info := rs.byHead[string(headOf(o.GetKey()))]
		if info == nil || info.mode != policy.RegionHome || info.home != r.cfg.Name {
			return nil, invalid(field("key"), "not a key of a rule with regions: home:%s here", r.cfg.Name)
		}
		kind, err := algorithm.ParseKind(o.GetAlgorithm())
		if err != nil {
			return nil, invalid(field("algorithm"), "%v", err)
		}
		if o.GetPeriodUs() <= 0 || o.GetPeriodUs() > algorithm.MaxPeriod.Microseconds() {
			return nil, invalid(field("period_us"), "must be from 1 to %d", algorithm.MaxPeriod.Microseconds())
		}
		p, err := algorithm.NewParams(kind, o.GetLimit(), o.GetBurst(), time.Duration(o.GetPeriodUs())*time.Microsecond)
		if err != nil {
			return nil, invalid(field("limit"), "%v", err)
		}
		if o.GetCost() < 0 || o.GetCost() > maxCost {
			return nil, invalid(field("cost"), "must be from 0 to %d", maxCost)
		}
		params[i] = p
		ops[i] = store.Op{Key: o.GetKey(), Params: &params[i], Cost: o.GetCost(), Shadow: o.GetShadow()}
	}
	b := &store.Batch{Ops: ops}
	if k := req.GetIdempotencyKey(); len(k) > 0 {
		ttl := time.Duration(req.GetIdempotencyTtlMs()) * time.Millisecond
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
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "home region %s: store: %v", r.cfg.Name, err)
	}
	resp := &sluicev1.DecideResponse{Replayed: replayed, Results: make([]*sluicev1.OpResult, len(results))}
	for i, a := range results {
		resp.Results[i] = &sluicev1.OpResult{Allowed: a.Allowed, CostExceedsCapacity: a.Reason == algorithm.ReasonCostExceedsCapacity,
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
		if !ok || r.peers[pi].rpc == nil {
			return false, fmt.Errorf("%w: region %s: %w", store.ErrUnavailable, home, errNoPeer)
		}
		req := &sluicev1.DecideRequest{Region: home, Ops: make([]*sluicev1.Op, len(these))}
		for j, i := range these {
			op := &b.Ops[i]
			req.Ops[j] = &sluicev1.Op{Key: op.Key, Algorithm: op.Params.Kind.String(), Limit: op.Params.Limit, Burst: op.Params.Burst,
				PeriodUs: op.Params.Period, Cost: op.Cost, Shadow: op.Shadow}
			if denied {
				req.Ops[j].Cost = 0
			}
		}
		if !denied && len(b.IdempotencyKey) > 0 {
			req.IdempotencyKey, req.IdempotencyTtlMs = b.IdempotencyKey, max(1, b.IdempotencyTTL.Milliseconds())
		}
		resp, err := r.peers[pi].rpc.Decide(ctx, req)
		if err == nil && len(resp.GetResults()) != len(these) {
			err = errors.New("answer holds the wrong number of results")
		}
		if status.Code(err) == codes.FailedPrecondition {
			return false, store.ErrIdempotencyMismatch
		}
		if err != nil {
			return false, fmt.Errorf("%w: home region %s: %w", store.ErrUnavailable, home, err)
		}
		for j, i := range these {
			a := resp.GetResults()[j]
			results[i] = algorithm.Result{Allowed: a.GetAllowed(), Remaining: a.GetRemaining(), ResetAfter: a.GetResetAfterUs(),
				RetryAfter: a.GetRetryAfterUs(), Delay: a.GetDelayUs()}
			if a.GetCostExceedsCapacity() {
				results[i].Reason = algorithm.ReasonCostExceedsCapacity
			}
			if !a.GetAllowed() && !b.Ops[i].Shadow {
				denied = true
			}
			homeReplayed = resp.GetReplayed()
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

var (
	peerUpDesc = prometheus.NewDesc("sluice_region_peer_up",
		"1 when the region was heard from within --region-timeout, 0 while it is silent (its last rate is assumed meanwhile).", []string{"region"}, nil)
	inboxLostDesc = prometheus.NewDesc("sluice_region_inbox_lost_total",
		"Syncs this node received that did not reach the region's inbox, by reason (queue_full, append_failed): merged here only until the sender's next full send (30 s).", []string{"reason"}, nil)
	inboxSkippedDesc = prometheus.NewDesc("sluice_region_inbox_skipped_total",
		"Records read from the region's inbox that did not read or check, skipped whole.", nil, nil)
	lagDesc = prometheus.NewDesc("sluice_region_lag_seconds",
		"Age of the newest counts held from the region: time since its last sync arrived plus the measured one-way delay.", []string{"region"}, nil)
)

// Describe is prometheus.Collector's.
func (r *Region) Describe(ch chan<- *prometheus.Desc) {
	ch <- peerUpDesc
	ch <- lagDesc
	if r.inbox != nil {
		ch <- inboxLostDesc
		ch <- inboxSkippedDesc
	}
}

// Collect is prometheus.Collector's: sluice_region_peer_up and sluice_region_lag_seconds per
// peer, as of the scrape, and with an inbox its losses and skipped records.
func (r *Region) Collect(ch chan<- prometheus.Metric) {
	now := r.nowMicros()
	for _, p := range r.peers {
		up := 0.0
		if r.isUp(p, now) {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(peerUpDesc, prometheus.GaugeValue, up, p.name)
		lag := math.Inf(1)
		if h := p.fromPeer.Load(); h > 0 {
			lag = float64(now-h+p.delay.Load()) / 1e6
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, p.name)
	}
	if r.inbox != nil {
		ch <- prometheus.MustNewConstMetric(inboxLostDesc, prometheus.CounterValue, float64(r.inboxLostQueue.Load()), "queue_full")
		ch <- prometheus.MustNewConstMetric(inboxLostDesc, prometheus.CounterValue, float64(r.inboxLostAppend.Load()), "append_failed")
		ch <- prometheus.MustNewConstMetric(inboxSkippedDesc, prometheus.CounterValue, float64(r.inboxSkipped.Load()))
	}
}
