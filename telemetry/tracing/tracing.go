// Package tracing puts Sluice's decisions into OpenTelemetry traces (docs/architecture.md,
// Tracing): one server span per decision, sluice.check or sluice.quota, carrying the deciding
// rule, the state, the store and its time, with the store call as a child span, sluice.store.
// Trace context comes from the caller: W3C traceparent in HTTP headers or gRPC metadata.
//
// Tracing is off when a server has no Tracer: a nil *Tracer and a nil *Span do nothing, so a
// server pays one nil check per request and allocates nothing for it.
package tracing

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
)

// ScopeName is the instrumentation scope of Sluice's spans.
const ScopeName = "github.com/sluicehq/sluice"

// The span names.
const (
	// CheckSpan is a decision that consumes (POST /v1/check, Check, ShouldRateLimit, /json).
	CheckSpan = "sluice.check"
	// QuotaSpan is a look that consumes nothing (POST /v1/quota, GetQuota, a cost of 0).
	QuotaSpan = "sluice.quota"
	// StoreSpan is one call of the store, a child of the decision's span.
	StoreSpan = "sluice.store"
)

// Tracer starts the spans of decisions. It is safe for concurrent use; a nil *Tracer traces
// nothing.
type Tracer struct {
	t     trace.Tracer
	prop  propagation.TextMapPropagator
	store string
}

// The options of every decision span and store span, built once: as variadic arguments
// built per call they would cost two allocations a call, sampled or not.
var (
	serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientSpan = trace.WithSpanKind(trace.SpanKindClient)
)

// New returns a Tracer whose spans come from tp and name storeName ("memory", "redis") as the
// store that decides.
func New(tp trace.TracerProvider, storeName string) *Tracer {
	return &Tracer{t: tp.Tracer(ScopeName), prop: propagation.TraceContext{}, store: storeName}
}

// Span is the span of one decision. The servers end it with EndCheck or EndDescriptors; the
// store wrapper (Tracer.Store) adds the store's time to it. A nil *Span does nothing: it is
// what a Tracer returns when tracing is off or the sampler dropped the trace.
//
// It embeds the SDK's span and is what the request's context carries as its current span,
// so that the store call finds it and becomes its child.
type Span struct {
	trace.Span
	api        string
	store      string
	storeTime  time.Duration
	storeCalls int
	fallback   bool
}

// StartHTTP starts the span of a decision served over HTTP by api ("http", "rls"), its parent
// taken from h's traceparent and tracestate. It returns the context to decide with, which
// carries the span, and the span, nil when the trace is not sampled.
func (t *Tracer) StartHTTP(ctx context.Context, h http.Header, api, name string) (context.Context, *Span) {
	if t == nil {
		return ctx, nil
	}
	return t.start(ctx, t.prop.Extract(ctx, header(h)), api, name)
}

// StartGRPC is StartHTTP for a call served over gRPC: the parent comes from the incoming
// metadata of ctx.
func (t *Tracer) StartGRPC(ctx context.Context, api, name string) (context.Context, *Span) {
	if t == nil {
		return ctx, nil
	}
	return t.start(ctx, t.prop.Extract(ctx, incoming{ctx}), api, name)
}

func (t *Tracer) start(ctx, parent context.Context, api, name string) (context.Context, *Span) {
	_, span := t.t.Start(parent, name, serverSpan...)
	if !span.IsRecording() {
		return ctx, nil // not sampled: nothing to fill in
	}
	sp := &Span{Span: span, api: api, store: t.store}
	return trace.ContextWithSpan(ctx, sp), sp
}

// Look renames the span sluice.quota: the request turned out to be a look (a cost of 0).
func (s *Span) Look() {
	if s != nil {
		s.SetName(QuotaSpan)
	}
}

// Attribute keys of the decision span (README, Deploy: observability, lists them).
const (
	attrAPI           = attribute.Key("sluice.api")
	attrAllowed       = attribute.Key("sluice.allowed")
	attrState         = attribute.Key("sluice.state")
	attrRule          = attribute.Key("sluice.rule")
	attrScope         = attribute.Key("sluice.scope")
	attrLimits        = attribute.Key("sluice.limits")
	attrLimit         = attribute.Key("sluice.limit")
	attrRemaining     = attribute.Key("sluice.remaining")
	attrRetryAfter    = attribute.Key("sluice.retry_after_ms")
	attrReason        = attribute.Key("sluice.reason")
	attrDegraded      = attribute.Key("sluice.degraded")
	attrShadow        = attribute.Key("sluice.shadow")
	attrExempt        = attribute.Key("sluice.exempt")
	attrReplayed      = attribute.Key("sluice.replayed")
	attrHotKey        = attribute.Key("sluice.hot_key")
	attrPolicy        = attribute.Key("sluice.policy_version")
	attrTenant        = attribute.Key("sluice.tenant")
	attrUser          = attribute.Key("sluice.user")
	attrAPIKey        = attribute.Key("sluice.api_key")
	attrIP            = attribute.Key("sluice.ip")
	attrEndpoint      = attribute.Key("sluice.endpoint")
	attrMethod        = attribute.Key("sluice.method")
	attrDomain        = attribute.Key("sluice.domain")
	attrDescriptors   = attribute.Key("sluice.descriptors")
	attrStore         = attribute.Key("sluice.store")
	attrStoreTime     = attribute.Key("sluice.store.duration_ms")
	attrStoreCalls    = attribute.Key("sluice.store.calls")
	attrStoreFallback = attribute.Key("sluice.store.fallback")
	attrStoreOps      = attribute.Key("sluice.store.ops")
	attrErrorType     = attribute.Key("error.type")
	attrErrorMessage  = attribute.Key("sluice.error")
)

// EndCheck ends the span of a native decision: r as the caller sent it (nil when it could
// not be read), d as the engine filled it, err the engine's or the decoder's error. The API
// key is kept as its hashed prefix (key.HashedAPIKey), as the violations log keeps it; the
// tenant and user are those the decision was made for.
func (s *Span) EndCheck(r *sluice.Request, d *sluice.Decision, err error) {
	if s == nil {
		return
	}
	a := make([]attribute.KeyValue, 0, 32)
	a = append(a, attrAPI.String(s.api))
	if err != nil {
		s.endError(a, err)
		return
	}
	a = append(a,
		attrAllowed.Bool(d.Allowed), attrState.String(d.State.String()),
		attrLimits.Int(len(d.Results)), attrDegraded.Bool(d.Degraded),
		attrPolicy.String(d.PolicyVersion))
	if d.Rule != "" {
		a = append(a, attrRule.String(d.Rule), attrScope.String(d.Scope),
			attrLimit.Int64(d.Limit), attrRemaining.Int64(d.Remaining))
	}
	if !d.Allowed {
		a = append(a, attrRetryAfter.Int64(ceilMillis(d.RetryAfter)), attrReason.String(d.Reason))
	}
	a = appendFlag(a, attrShadow, d.Shadow)
	a = appendFlag(a, attrExempt, d.Exempt)
	a = appendFlag(a, attrReplayed, d.Replayed)
	a = appendFlag(a, attrHotKey, d.HotKey)
	if r != nil {
		tenant, user := d.Caller()
		a = appendString(a, attrTenant, tenant)
		a = appendString(a, attrUser, user)
		if r.APIKey != "" {
			a = append(a, attrAPIKey.String(key.HashedAPIKey(r.APIKey)))
		}
		a = appendString(a, attrIP, r.IP)
		a = appendString(a, attrEndpoint, r.Endpoint)
		a = appendString(a, attrMethod, r.Method)
	}
	s.end(a)
}

// EndDescriptors ends the span of an Envoy RLS decision. Descriptor entries are not recorded:
// they carry whatever Envoy was told to send (a header, an API key), so the span names the
// domain and the deciding limit only.
func (s *Span) EndDescriptors(r *sluice.DescriptorRequest, d *sluice.DescriptorDecision, err error) {
	if s == nil {
		return
	}
	a := make([]attribute.KeyValue, 0, 16)
	a = append(a, attrAPI.String(s.api))
	if r != nil {
		a = appendString(a, attrDomain, r.Domain)
		a = append(a, attrDescriptors.Int(len(r.Descriptors)))
	}
	if err != nil {
		s.endError(a, err)
		return
	}
	state := sluice.StateNormal
	if !d.OK {
		state = sluice.StateHard
	}
	limits, shadow, deciding := 0, false, -1
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if !st.HasLimit {
			continue
		}
		limits++
		shadow = shadow || st.Shadow
		// The deciding limit: the first over its limit, else the one with the least left.
		if deciding < 0 || (!st.OK && d.Statuses[deciding].OK) || (st.OK == d.Statuses[deciding].OK && st.OK && st.Remaining < d.Statuses[deciding].Remaining) {
			deciding = i
		}
	}
	a = append(a, attrAllowed.Bool(d.OK), attrState.String(state.String()),
		attrLimits.Int(limits), attrDegraded.Bool(d.Degraded))
	if deciding >= 0 {
		st := &d.Statuses[deciding]
		a = append(a, attrRule.String(st.Name), attrLimit.Int64(int64(st.RequestsPerUnit)), attrRemaining.Int64(int64(st.Remaining)))
	}
	a = appendFlag(a, attrShadow, shadow)
	s.end(a)
}

// end adds the store's share and ends the span.
func (s *Span) end(a []attribute.KeyValue) {
	a = append(a, attrStore.String(s.store), attrStoreCalls.Int(s.storeCalls))
	if s.storeCalls > 0 {
		a = append(a, attrStoreTime.Float64(float64(s.storeTime)/float64(time.Millisecond)))
	}
	a = appendFlag(a, attrStoreFallback, s.fallback)
	s.SetAttributes(a...)
	s.Span.End()
}

// endError ends the span of a request that was not decided. Following the semantic
// conventions for server spans, the caller's mistakes (bad input, a reused idempotency key)
// leave the status unset and say what they were in error.type; a decision the limiter could
// not make is an error.
func (s *Span) endError(a []attribute.KeyValue, err error) {
	kind := errorType(err)
	a = append(a, attrErrorType.String(kind), attrErrorMessage.String(err.Error()))
	if kind == "unavailable" {
		s.SetStatus(codes.Error, err.Error())
	}
	s.end(a)
}

// errorType classifies an error of a decision for error.type: "invalid" (it wraps
// policy.ErrInvalid), "idempotency_mismatch", or "unavailable" (the limiter could not decide).
func errorType(err error) string {
	switch {
	case isInvalid(err):
		return "invalid"
	case isMismatch(err):
		return "idempotency_mismatch"
	}
	return "unavailable"
}

// ceilMillis rounds up, as the answers' retry_after_ms do, dividing first so that a ban that
// lasts "forever" (the longest Duration) does not overflow.
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

func isInvalid(err error) bool  { return errors.Is(err, policy.ErrInvalid) }
func isMismatch(err error) bool { return errors.Is(err, sluice.ErrIdempotencyMismatch) }

func appendFlag(a []attribute.KeyValue, k attribute.Key, v bool) []attribute.KeyValue {
	if v {
		return append(a, k.Bool(true))
	}
	return a
}

func appendString(a []attribute.KeyValue, k attribute.Key, v string) []attribute.KeyValue {
	if v != "" {
		return append(a, k.String(v))
	}
	return a
}

// Store wraps st, named name, so that each Apply made for a traced decision becomes a child
// span of it and adds its time to the decision's span. Calls outside a traced decision pass
// straight through. A nil Tracer returns st itself: with tracing off the store stack is as it
// was.
func (t *Tracer) Store(st store.Store, name string) store.Store {
	if t == nil {
		return st
	}
	return &tracedStore{Store: st, t: t, name: name}
}

// Fallback is Store for the memory store that on_store_error: local rules fall back to: its
// spans say sluice.store.fallback, and so does the decision's.
func (t *Tracer) Fallback(st store.Store) store.Store {
	if t == nil {
		return st
	}
	return &tracedStore{Store: st, t: t, name: "memory", fallback: true}
}

type tracedStore struct {
	store.Store
	t        *Tracer
	name     string
	fallback bool
}

// Apply times the call and records it after the fact, with the times it measured, so the
// span's own cost is not counted as the store's.
func (s *tracedStore) Apply(ctx context.Context, b *store.Batch, res []algorithm.Result) (bool, error) {
	sp, ok := trace.SpanFromContext(ctx).(*Span)
	if !ok {
		return s.Store.Apply(ctx, b, res)
	}
	start := spanNow(sp.Span)
	replayed, err := s.Store.Apply(ctx, b, res)
	end := spanNow(sp.Span)
	sp.storeTime += end.Sub(start)
	sp.storeCalls++
	sp.fallback = sp.fallback || s.fallback
	_, child := s.t.t.Start(ctx, StoreSpan, clientSpan, trace.WithTimestamp(start))
	a := make([]attribute.KeyValue, 0, 6)
	a = append(a, attrStore.String(s.name), attrStoreOps.Int(len(b.Ops)))
	a = appendFlag(a, attrStoreFallback, s.fallback)
	a = appendFlag(a, attrHotKey, b.HotKey)
	a = appendFlag(a, attrReplayed, replayed)
	if err != nil {
		a = append(a, attrErrorMessage.String(err.Error()))
		if isMismatch(err) {
			a = append(a, attrErrorType.String("idempotency_mismatch"))
		} else {
			a = append(a, attrErrorType.String("unavailable"))
			child.SetStatus(codes.Error, err.Error())
		}
	}
	child.SetAttributes(a...)
	child.End(trace.WithTimestamp(end))
	return replayed, err
}

// spanNow reads the clock as the SDK ends a span: the span's wall-clock start plus the
// monotonic time since. A wall clock stepped in between (NTP on a busy VM) then cannot put the
// store call outside the decision that made it, as time.Now's wall reading did.
func spanNow(sp trace.Span) time.Time {
	if ro, ok := sp.(interface{ StartTime() time.Time }); ok {
		st := ro.StartTime()
		return st.Add(time.Since(st))
	}
	return time.Now()
}

// header reads trace context from HTTP headers. The W3C names are looked up in their
// canonical form directly: http.Header.Get would canonicalize them, one allocation a call.
type header http.Header

func (h header) Get(key string) string {
	var v []string
	switch key {
	case "traceparent":
		v = h["Traceparent"]
	case "tracestate":
		v = h["Tracestate"]
	default:
		return http.Header(h).Get(key)
	}
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (header) Set(string, string) {} // extraction only

func (h header) Keys() []string { return propagation.HeaderCarrier(h).Keys() }

// incoming reads trace context from a gRPC call's incoming metadata without copying all of it.
type incoming struct{ ctx context.Context }

func (c incoming) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (incoming) Set(string, string) {} // extraction only

func (c incoming) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}

// PutLease passes to the traced store (store.Leaser).
func (s *tracedStore) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	l, err := store.AsLeaser(s.Store)
	if err != nil {
		return err
	}
	return l.PutLease(ctx, id, rec, ttl)
}

// SettleLease passes to the traced store (store.Leaser).
func (s *tracedStore) SettleLease(ctx context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	l, err := store.AsLeaser(s.Store)
	if err != nil {
		return nil, 0, false, err
	}
	return l.SettleLease(ctx, id, used)
}

// Adjust passes to the traced store (store.Leaser).
func (s *tracedStore) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	l, err := store.AsLeaser(s.Store)
	if err != nil {
		return err
	}
	return l.Adjust(ctx, ops, at)
}

// RenewLease passes to the store that keeps leases (store.Leaser).
func (s *tracedStore) RenewLease(ctx context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	l, err := store.AsLeaser(s.Store)
	if err != nil {
		return nil, err
	}
	return l.RenewLease(ctx, id, ttl)
}
