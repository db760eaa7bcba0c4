// Package grpcapi serves Sluice's native gRPC API, sluice.v1.RateLimiter (Check, GetQuota,
// Reset), over a sluice.Limiter.
package grpcapi

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/grpcdecode"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/tracing"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// api labels this server's metrics.
const api = "grpc"

// Server implements sluicev1.RateLimiterServer. Errors follow the JSON API: bad input is
// InvalidArgument naming the field and consumes nothing; a store that cannot decide (with no
// fallback for the rule) is Unavailable. A denial is not an error: it is an OK answer with
// allowed false.
type Server struct {
	sluicev1.UnimplementedRateLimiterServer

	l *sluice.Limiter
	m *metrics.Metrics
	// decisions recycles Decisions: the engine fills one in place and keeps its buffers, so a
	// reused Decision checks without allocating.
	decisions sync.Pool
	// resetAuth, when set, must pass before a Reset (WithResetAuth).
	resetAuth func(ctx context.Context) error
	// events counts the decisions of checks (WithEvents); nil counts nothing.
	events *usage.Recorder
	// tracer gives every Check and GetQuota a span (WithTracer); nil traces nothing.
	tracer *tracing.Tracer
}

// Option configures a Server.
type Option func(*Server)

// WithResetAuth makes Reset call auth first and fail with its error, a gRPC status: resets
// need a write token (docs/architecture.md, Admin API), which adminapi.Server.GRPCAuth(control.RoleWrite) checks in
// the "authorization" metadata (Unauthenticated, PermissionDenied).
func WithResetAuth(auth func(ctx context.Context) error) Option {
	return func(s *Server) { s.resetAuth = auth }
}

// WithEvents counts every Check's decision (not looks, nor GetQuota) in rec, for the
// violations log and usage history.
func WithEvents(rec *usage.Recorder) Option {
	return func(s *Server) { s.events = rec }
}

// WithTracer gives every Check and GetQuota a span from t, its parent taken from the call's
// traceparent metadata.
func WithTracer(t *tracing.Tracer) Option {
	return func(s *Server) { s.tracer = t }
}

var _ sluicev1.RateLimiterServer = (*Server)(nil)

// New returns a Server deciding with l. m may be nil to record no metrics.
func New(l *sluice.Limiter, m *metrics.Metrics, opts ...Option) *Server {
	s := &Server{l: l, m: m}
	for _, o := range opts {
		o(s)
	}
	s.decisions.New = func() any { return new(sluice.Decision) }
	return s
}

// Register adds the service to gs. Use it rather than sluicev1.RegisterRateLimiterServer: it
// also answers a request that does not decode (a string that is not valid UTF-8, which proto3
// rejects while unmarshalling) with InvalidArgument naming the field, where gRPC would answer
// Internal, a server fault, for the client's bad input. It assumes gs decodes with the
// standard proto codec (no ForceServerCodec).
func (s *Server) Register(gs *grpc.Server) {
	grpcdecode.Register(gs, &sluicev1.RateLimiter_ServiceDesc, s, func() { s.m.Rejected(api, "invalid") })
}

// Check decides the request and consumes its cost (absent: 1; 0 looks without consuming).
func (s *Server) Check(ctx context.Context, in *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	start := time.Now()
	var sp *tracing.Span
	if s.tracer != nil {
		ctx, sp = s.tracer.StartGRPC(ctx, api, tracing.CheckSpan)
	}
	var r policy.Request
	look, err := requestOf(in, &r)
	if err != nil {
		sp.EndCheck(nil, nil, err)
		return nil, s.fail(err)
	}
	d := s.decisions.Get().(*sluice.Decision)
	defer s.decisions.Put(d)
	if look {
		sp.Look()
		err = s.l.Quota(ctx, &r, d)
	} else {
		err = s.l.Check(ctx, &r, d)
	}
	sp.EndCheck(&r, d, err)
	if err != nil {
		return nil, s.fail(err)
	}
	s.m.ObserveCheck(api, d, time.Since(start))
	if !look {
		s.events.Check(&r, d)
	}
	return responseOf(d), nil
}

// GetQuota reports the request's limits without consuming; its cost and idempotency_key are
// not used, but a bad cost is still an error so that a caller learns of it.
func (s *Server) GetQuota(ctx context.Context, in *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	start := time.Now()
	var sp *tracing.Span
	if s.tracer != nil {
		ctx, sp = s.tracer.StartGRPC(ctx, api, tracing.QuotaSpan)
	}
	var r policy.Request
	if _, err := requestOf(in, &r); err != nil {
		sp.EndCheck(nil, nil, err)
		return nil, s.fail(err)
	}
	d := s.decisions.Get().(*sluice.Decision)
	defer s.decisions.Put(d)
	err := s.l.Quota(ctx, &r, d)
	sp.EndCheck(&r, d, err)
	if err != nil {
		return nil, s.fail(err)
	}
	s.m.ObserveCheck(api, d, time.Since(start))
	return responseOf(d), nil
}

// Reset restores the buckets the attributes address, or only those of the named rule.
func (s *Server) Reset(ctx context.Context, in *sluicev1.ResetRequest) (*sluicev1.ResetResponse, error) {
	if s.resetAuth != nil {
		if err := s.resetAuth(ctx); err != nil {
			return nil, err
		}
	}
	r := policy.Request{
		Tenant: in.GetTenant(), User: in.GetUser(), APIKey: in.GetApiKey(), IP: in.GetIp(),
		Endpoint: in.GetEndpoint(), Method: in.GetMethod(), Tier: in.GetTier(),
		Descriptors: in.GetDescriptors(),
	}
	n, err := s.l.Reset(ctx, &r, in.GetRule())
	if err != nil {
		return nil, s.fail(err)
	}
	return &sluicev1.ResetResponse{KeysReset: int64(n)}, nil
}

// fail maps an engine error to a status: bad input is InvalidArgument with the error's text,
// which names the field; an idempotency key reused for another request is FailedPrecondition
// (its text names idempotency_key); anything else means the limiter could not decide.
//
// FailedPrecondition rather than InvalidArgument: the request is valid on its own and fails
// only because of the state the key's first use left, and gRPC's guide reserves
// InvalidArgument for arguments wrong whatever the state. Like 422 on HTTP, it tells the
// client not to retry as is: send the request with a fresh key, or the first request again.
func (s *Server) fail(err error) error {
	switch {
	case errors.Is(err, policy.ErrInvalid):
		s.m.Rejected(api, "invalid")
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, sluice.ErrIdempotencyMismatch):
		s.m.Rejected(api, "idempotency_mismatch")
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// requestOf fills r from in. look reports a cost of 0 given explicitly: a look without
// consuming. The engine validates the attributes; only what the wire form adds is checked
// here, because policy.Request has no way to say "absent".
func requestOf(in *sluicev1.CheckRequest, r *policy.Request) (look bool, err error) {
	*r = policy.Request{
		Tenant: in.GetTenant(), User: in.GetUser(), APIKey: in.GetApiKey(), IP: in.GetIp(),
		Endpoint: in.GetEndpoint(), Method: in.GetMethod(), Tier: in.GetTier(),
		Descriptors: in.GetDescriptors(), IdempotencyKey: in.GetIdempotencyKey(),
		Cost: 1,
	}
	if in != nil && in.Cost != nil {
		r.Cost = *in.Cost
	}
	if r.Cost < 0 {
		return false, &policy.FieldError{Field: "cost", Msg: "must be >= 0"}
	}
	return r.Cost == 0, nil
}

// responseOf converts a decision to its wire form. The results share one backing array: one
// allocation for the list, not one per limit.
func responseOf(d *sluice.Decision) *sluicev1.CheckResponse {
	out := &sluicev1.CheckResponse{
		Allowed:       d.Allowed,
		State:         stateOf(d.State),
		Limit:         d.Limit,
		Remaining:     d.Remaining,
		ResetAfterMs:  ceilMillis(d.ResetAfter),
		RetryAfterMs:  ceilMillis(d.RetryAfter),
		DelayMs:       ceilMillis(d.Delay),
		Rule:          d.Rule,
		Scope:         d.Scope,
		Shadow:        d.Shadow,
		Exempt:        d.Exempt,
		Replayed:      d.Replayed,
		Degraded:      d.Degraded,
		Reason:        d.Reason,
		PolicyVersion: d.PolicyVersion,
	}
	if len(d.Results) == 0 {
		return out
	}
	results := make([]sluicev1.LimitResult, len(d.Results))
	out.Results = make([]*sluicev1.LimitResult, len(d.Results))
	for i := range d.Results {
		r, w := &d.Results[i], &results[i]
		w.Rule, w.Scope, w.Algorithm = r.Rule, r.Scope, r.Algorithm.String()
		w.Allowed, w.State, w.Limit, w.Remaining = r.Allowed, stateOf(r.State), r.Limit, r.Remaining
		w.ResetAfterMs, w.RetryAfterMs, w.DelayMs = ceilMillis(r.ResetAfter), ceilMillis(r.RetryAfter), ceilMillis(r.Delay)
		w.Shadow, w.Reason, w.InFlight = r.Shadow, r.Reason, r.InFlight()
		out.Results[i] = w
	}
	return out
}

func stateOf(s sluice.State) sluicev1.State {
	switch s {
	case sluice.StateSoft:
		return sluicev1.State_STATE_SOFT
	case sluice.StateHard:
		return sluicev1.State_STATE_HARD
	}
	return sluicev1.State_STATE_NORMAL
}

// ceilMillis rounds d up to whole milliseconds, as the JSON API does, so a caller that waits
// retry_after_ms is never early. It divides before rounding: adding 999µs first would overflow
// for a ban that lasts "forever" (the longest Duration).
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}
