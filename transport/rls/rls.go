// Package rls serves Envoy's rate limit service, envoy.service.ratelimit.v3.RateLimitService,
// from a sluice.Limiter, answering as the reference service (github.com/envoyproxy/ratelimit)
// does so that Envoy, Istio, Contour, Emissary and Gloo can point at Sluice unchanged.
package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/telemetry/metrics"
	"github.com/sluicehq/sluice/telemetry/tracing"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// The reference service's default header names (its LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER
// and LIMIT_RESET_HEADER settings).
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// api labels this server's metrics.
const api = "rls"

// Options configures a Server. The cmd layer fills it from the environment variables the
// reference service reads, so that deployments move unchanged.
type Options struct {
	// ResponseHeaders adds the limit, remaining and reset of the most constrained descriptor to
	// response_headers_to_add (LIMIT_RESPONSE_HEADERS_ENABLED=true).
	ResponseHeaders bool
	// LimitHeader, RemainingHeader and ResetHeader rename those headers (LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); empty keeps the defaults above.
	LimitHeader, RemainingHeader, ResetHeader string
	// DynamicMetadata sets the answer's dynamic_metadata as the reference service does with
	// RESPONSE_DYNAMIC_METADATA=true (see dynamicMetadata).
	DynamicMetadata bool
	// Events, when set, counts every decision (descriptors with hits_addend 0 are looks and
	// are not counted) for the violations log and usage history.
	Events *usage.Recorder
	// Tracer, when set, gives every decision a span, its parent taken from the traceparent
	// of the call's gRPC metadata (or HTTP headers, for /json); nil traces nothing.
	Tracer *tracing.Tracer
}

// Server implements RateLimitService/ShouldRateLimit over a Limiter. It is safe for
// concurrent use; create it with New.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	l    *sluice.Limiter
	m    *metrics.Metrics
	o    Options
	pool sync.Pool // *call
}

// New returns a Server deciding with l and recording to m (which may be nil).
func New(l *sluice.Limiter, m *metrics.Metrics, o Options) *Server {
	if o.LimitHeader == "" {
		o.LimitHeader = DefaultLimitHeader
	}
	if o.RemainingHeader == "" {
		o.RemainingHeader = DefaultRemainingHeader
	}
	if o.ResetHeader == "" {
		o.ResetHeader = DefaultResetHeader
	}
	s := &Server{l: l, m: m, o: o}
	s.pool.New = func() any { return new(call) }
	return s
}

// call is the per-request state that is pooled: the engine request, its decision with the
// engine's own buffers, and the backing arrays the request's slices point into.
type call struct {
	req     sluice.DescriptorRequest
	dec     sluice.DescriptorDecision
	entries []envoyconf.Entry
	limits  []sluice.DescriptorLimit
}

// maxPooledEntries bounds the entry buffer a pooled call keeps, so that one huge request does
// not pin its memory for the life of the process.
const maxPooledEntries = 1024

func (s *Server) put(c *call) {
	if cap(c.entries) > maxPooledEntries {
		return
	}
	// Drop the references to the request's strings so they can be collected.
	clear(c.entries[:cap(c.entries)])
	clear(c.req.Descriptors[:cap(c.req.Descriptors)])
	c.req = sluice.DescriptorRequest{Descriptors: c.req.Descriptors[:0]}
	s.pool.Put(c)
}

// ShouldRateLimit decides a request of Envoy's rate limit filter. Bad input (an empty domain,
// no descriptors, an entry without a key) is InvalidArgument; nothing is consumed then.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var sp *tracing.Span
	if s.o.Tracer != nil {
		ctx, sp = s.o.Tracer.StartGRPC(ctx, api, tracing.CheckSpan)
	}
	return s.decide(ctx, in, sp)
}

// decide is ShouldRateLimit once the call's span, if any, is started; sp may be nil.
func (s *Server) decide(ctx context.Context, in *rlsv3.RateLimitRequest, sp *tracing.Span) (*rlsv3.RateLimitResponse, error) {
	var start time.Time
	if s.m != nil {
		start = time.Now()
	}
	c := s.pool.Get().(*call)
	defer s.put(c)
	err := c.fill(in)
	if err == nil {
		err = s.l.CheckDescriptors(ctx, &c.req, &c.dec)
	}
	sp.EndDescriptors(&c.req, &c.dec, err)
	if err != nil {
		if errors.Is(err, policy.ErrInvalid) {
			s.m.Rejected(api, "invalid")
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := s.respond(&c.dec)
	if s.o.DynamicMetadata {
		md, err := dynamicMetadata(in, &c.dec)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		resp.DynamicMetadata = md
	}
	s.m.ObserveDescriptors(api, &c.req, &c.dec, time.Since(start))
	s.o.Events.Descriptors(&c.req, &c.dec)
	return resp, nil
}

// fill maps in onto c.req. Entries and override limits of all descriptors share one backing
// array each, grown once before they are pointed into, so the pointers stay valid.
func (c *call) fill(in *rlsv3.RateLimitRequest) error {
	descs := in.GetDescriptors()
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	if cap(c.entries) < n {
		c.entries = make([]envoyconf.Entry, n)
	}
	entries := c.entries[:n]
	if cap(c.limits) < len(descs) {
		c.limits = make([]sluice.DescriptorLimit, 0, len(descs))
	}
	limits := c.limits[:0]

	c.req.Domain = in.GetDomain()
	c.req.HitsAddend = uint64(in.GetHitsAddend())
	c.req.Descriptors = c.req.Descriptors[:0]
	for i, d := range descs {
		es := d.GetEntries()
		dst := entries[:len(es):len(es)]
		entries = entries[len(es):]
		for j, e := range es {
			dst[j] = envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		desc := sluice.Descriptor{Entries: dst}
		if h := d.GetHitsAddend(); h != nil {
			desc.HitsAddend, desc.HasHitsAddend = h.GetValue(), true
		}
		if d.GetIsNegativeHits() {
			// The engine has no refund; counting the hits instead would charge the caller twice.
			return &policy.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].is_negative_hits", Msg: "refunds are not supported"}
		}
		if o := d.GetLimit(); o != nil {
			limits = append(limits, sluice.DescriptorLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unitName(o.GetUnit())})
			desc.Limit = &limits[len(limits)-1]
		}
		c.req.Descriptors = append(c.req.Descriptors, desc)
	}
	return nil
}

// smallN is how many descriptors a response holds in one allocation; Envoy's requests rarely
// carry more.
const smallN = 4

// smallResponse puts a response and everything it points to in one allocation.
type smallResponse struct {
	resp     rlsv3.RateLimitResponse
	ptrs     [smallN]*rlsv3.RateLimitResponse_DescriptorStatus
	statuses [smallN]rlsv3.RateLimitResponse_DescriptorStatus
	limits   [smallN]rlsv3.RateLimitResponse_RateLimit
	resets   [smallN]durationpb.Duration
}

// respond builds the response as the reference does. The response outlives the call (gRPC
// marshals it after the handler returns), so it is allocated, not pooled.
func (s *Server) respond(d *sluice.DescriptorDecision) *rlsv3.RateLimitResponse {
	n := len(d.Statuses)
	var (
		resp     *rlsv3.RateLimitResponse
		statuses []rlsv3.RateLimitResponse_DescriptorStatus
		limits   []rlsv3.RateLimitResponse_RateLimit
		resets   []durationpb.Duration
	)
	if n <= smallN {
		a := new(smallResponse)
		resp, statuses, limits, resets = &a.resp, a.statuses[:n], a.limits[:n], a.resets[:n]
		resp.Statuses = a.ptrs[:n]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		limits = make([]rlsv3.RateLimitResponse_RateLimit, n)
		resets = make([]durationpb.Duration, n)
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if !d.OK {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}

	// The headers describe the descriptor closest to its limit, chosen as the reference does:
	// the last one over its limit, else the first with the least remaining, among those that
	// had a limit; a remaining of MaxUint32 never qualifies, as its search starts there. A
	// quota_mode descriptor over its limit counts only by its remaining (0), as there.
	header := -1
	least := uint32(math.MaxUint32)
	for i := range d.Statuses {
		st, out := &d.Statuses[i], &statuses[i]
		resp.Statuses[i] = out
		out.Code = rlsv3.RateLimitResponse_OK
		if !st.OK {
			out.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		out.LimitRemaining = st.Remaining
		if !st.HasLimit {
			continue
		}
		if !st.OK || st.Shadow {
			// The reference reports nothing left once over, even where a smaller hit would fit.
			out.LimitRemaining = 0
		}
		lim, reset := &limits[i], &resets[i]
		lim.Name, lim.RequestsPerUnit, lim.Unit = st.Name, st.RequestsPerUnit, unitEnum(st.Unit)
		reset.Seconds = ceilSeconds(st.ResetAfter)
		out.CurrentLimit, out.DurationUntilReset = lim, reset
		if (!st.OK && !st.Quota) || out.LimitRemaining < least {
			header, least = i, out.LimitRemaining
		}
	}
	if s.o.ResponseHeaders && header >= 0 {
		out := resp.Statuses[header]
		hv := make([]corev3.HeaderValue, 3)
		hv[0].Key, hv[0].Value = s.o.LimitHeader, strconv.FormatUint(uint64(out.CurrentLimit.RequestsPerUnit), 10)
		hv[1].Key, hv[1].Value = s.o.RemainingHeader, strconv.FormatUint(uint64(out.LimitRemaining), 10)
		hv[2].Key, hv[2].Value = s.o.ResetHeader, strconv.FormatInt(out.DurationUntilReset.Seconds, 10)
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{&hv[0], &hv[1], &hv[2]}
	}
	return resp
}

// ceilSeconds rounds up to whole seconds, which is what the reference reports: it computes
// the reset as unit - now%unit on a clock of whole seconds, so 47.5s left reads 48.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// unitName maps a per-request override's unit to the engine's name for it. Constant strings
// keep the hot path free of allocation; an unknown value gets its enum name, which the engine
// rejects by name.
func unitName(u typev3.RateLimitUnit) string {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return "second"
	case typev3.RateLimitUnit_MINUTE:
		return "minute"
	case typev3.RateLimitUnit_HOUR:
		return "hour"
	case typev3.RateLimitUnit_DAY:
		return "day"
	case typev3.RateLimitUnit_MONTH:
		return "month"
	case typev3.RateLimitUnit_YEAR:
		return "year"
	case typev3.RateLimitUnit(rlsv3.RateLimitResponse_RateLimit_WEEK):
		// envoy.type.v3 has no WEEK yet; newer Envoys may send the number the response enum uses.
		return "week"
	}
	return strings.ToLower(u.String())
}

// unitEnum maps the engine's unit name to the response enum.
func unitEnum(unit string) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch unit {
	case "second":
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case "minute":
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case "hour":
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case "day":
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case "week":
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case "month":
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case "year":
		return rlsv3.RateLimitResponse_RateLimit_YEAR
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}
