package regionrpc

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/region"
)

// link is the gRPC connection to one peer's Regions service (region.Link).
type link struct {
	conn *grpc.ClientConn
	rpc  sluicev1.RegionsClient

	cancel  context.CancelFunc // stops watch
	watched sync.WaitGroup
	once    sync.Once
}

// Dial connects to a peer's Regions service (region.Dialer): with the region token on every
// call, over TLS with Options.TLS. Reconnect attempts are no further apart than half a sync
// (gRPC's default backoff grows to 2 minutes), and cfg.Ready is called as soon as the
// connection is ready again: a healed link carries what the partition held back within one
// sync of the heal.
func (t *Transport) Dial(cfg region.LinkConfig) (region.Link, error) {
	creds := insecure.NewCredentials()
	if t.opts.TLS != nil {
		creds = credentials.NewTLS(t.opts.TLS)
	}
	bo := backoff.Config{BaseDelay: cfg.Sync / 4, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.Sync / 2}
	conn, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(tokenCredentials{header: "Bearer " + t.opts.Token}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: cfg.CallTimeout}))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &link{conn: conn, rpc: sluicev1.NewRegionsClient(conn), cancel: cancel}
	l.watched.Add(1)
	go l.watch(ctx, cfg.Ready)
	return l, nil
}

// watch calls ready when the connection becomes ready again, until ctx ends.
func (l *link) watch(ctx context.Context, ready func()) {
	defer l.watched.Done()
	l.conn.Connect()
	state := l.conn.GetState()
	for l.conn.WaitForStateChange(ctx, state) {
		next := l.conn.GetState()
		if next == connectivity.Ready && state != connectivity.Ready && ready != nil {
			ready()
		}
		state = next
	}
}

// Sync sends msg, compressed: a message repeats the rule's key head in every count.
func (l *link) Sync(ctx context.Context, msg *region.SyncMessage) error {
	_, err := l.rpc.Sync(ctx, syncToProto(msg), grpc.UseCompressor(gzip.Name))
	return err
}

// Decide has the home region decide req. Its FailedPrecondition, an idempotency key used
// before for other ops, is store.ErrIdempotencyMismatch.
func (l *link) Decide(ctx context.Context, req *region.DecideRequest) (*region.DecideResponse, error) {
	resp, err := l.rpc.Decide(ctx, decideToProto(req))
	if status.Code(err) == codes.FailedPrecondition {
		return nil, store.ErrIdempotencyMismatch
	}
	if err != nil {
		return nil, err
	}
	return decideResponseFromProto(resp), nil
}

// Close stops watching the connection and closes it.
func (l *link) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		l.watched.Wait()
		err = l.conn.Close()
	})
	return err
}

// syncToProto is msg as the wire carries it.
func syncToProto(msg *region.SyncMessage) *sluicev1.SyncRequest {
	req := &sluicev1.SyncRequest{Region: msg.Region, SentAtUs: msg.SentAtUs, SyncIntervalUs: msg.SyncIntervalUs,
		Counts: make([]*sluicev1.WindowCount, len(msg.Counts))}
	for i, c := range msg.Counts {
		req.Counts[i] = &sluicev1.WindowCount{Key: c.Key, WindowStartUs: c.WindowStartUs, Count: c.Count, Rate: c.Rate}
	}
	return req
}

// syncFromProto is req as the Region reads it. The keys are req's, not copies.
func syncFromProto(req *sluicev1.SyncRequest) *region.SyncMessage {
	msg := &region.SyncMessage{Region: req.GetRegion(), SentAtUs: req.GetSentAtUs(), SyncIntervalUs: req.GetSyncIntervalUs(),
		Counts: make([]region.WindowCount, len(req.GetCounts()))}
	for i, c := range req.GetCounts() {
		msg.Counts[i] = region.WindowCount{Key: c.GetKey(), WindowStartUs: c.GetWindowStartUs(), Count: c.GetCount(), Rate: c.GetRate()}
	}
	return msg
}

// decideToProto is req as the wire carries it.
func decideToProto(req *region.DecideRequest) *sluicev1.DecideRequest {
	out := &sluicev1.DecideRequest{Region: req.Region, IdempotencyKey: req.IdempotencyKey, IdempotencyTtlMs: req.IdempotencyTTLMs,
		Ops: make([]*sluicev1.Op, len(req.Ops))}
	for i, o := range req.Ops {
		out.Ops[i] = &sluicev1.Op{Key: o.Key, Algorithm: o.Algorithm, Limit: o.Limit, Burst: o.Burst, PeriodUs: o.PeriodUs,
			Cost: o.Cost, Shadow: o.Shadow}
	}
	return out
}

// decideFromProto is req as the Region reads it.
func decideFromProto(req *sluicev1.DecideRequest) *region.DecideRequest {
	out := &region.DecideRequest{Region: req.GetRegion(), IdempotencyKey: req.GetIdempotencyKey(), IdempotencyTTLMs: req.GetIdempotencyTtlMs(),
		Ops: make([]region.DecideOp, len(req.GetOps()))}
	for i, o := range req.GetOps() {
		out.Ops[i] = region.DecideOp{Key: o.GetKey(), Algorithm: o.GetAlgorithm(), Limit: o.GetLimit(), Burst: o.GetBurst(),
			PeriodUs: o.GetPeriodUs(), Cost: o.GetCost(), Shadow: o.GetShadow()}
	}
	return out
}

// decideResponseToProto is resp as the wire carries it.
func decideResponseToProto(resp *region.DecideResponse) *sluicev1.DecideResponse {
	out := &sluicev1.DecideResponse{Replayed: resp.Replayed, Results: make([]*sluicev1.OpResult, len(resp.Results))}
	for i, a := range resp.Results {
		out.Results[i] = &sluicev1.OpResult{Allowed: a.Allowed, CostExceedsCapacity: a.CostExceedsCapacity,
			Remaining: a.Remaining, ResetAfterUs: a.ResetAfterUs, RetryAfterUs: a.RetryAfterUs, DelayUs: a.DelayUs}
	}
	return out
}

// decideResponseFromProto is resp as the Region reads it.
func decideResponseFromProto(resp *sluicev1.DecideResponse) *region.DecideResponse {
	out := &region.DecideResponse{Replayed: resp.GetReplayed(), Results: make([]region.OpResult, len(resp.GetResults()))}
	for i, a := range resp.GetResults() {
		out.Results[i] = region.OpResult{Allowed: a.GetAllowed(), CostExceedsCapacity: a.GetCostExceedsCapacity(),
			Remaining: a.GetRemaining(), ResetAfterUs: a.GetResetAfterUs(), RetryAfterUs: a.GetRetryAfterUs(), DelayUs: a.GetDelayUs()}
	}
	return out
}
