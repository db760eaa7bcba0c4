package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/grpctest"
	"github.com/sluicehq/sluice/internal/testkit/oteltest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/telemetry/tracing"
	"github.com/sluicehq/sluice/transport/grpcapi"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/rls"
)

const policyYAML = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 2, period: 1h}
`

const envoyYAML = `
domain: edge
descriptors:
  - key: client_id
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// A caller's sampled trace: version 00, trace id, parent span id, flags 01 (sampled).
const (
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID = "00f067aa0ba902b7"
	sampled  = "00-" + traceID + "-" + parentID + "-01"
	dropped  = "00-" + traceID + "-" + parentID + "-00"
)

// env is a tracer exporting to an in-process receiver over OTLP/gRPC, and a limiter whose
// memory store is wrapped by it, as serve wires them.
type env struct {
	recv *oteltest.Receiver
	tp   *sdktrace.TracerProvider
	tr   *tracing.Tracer
	lim  *sluice.Limiter
}

func newEnv(t *testing.T, ratio float64, yml string) *env {
	t.Helper()
	recv := oteltest.Start(t)
	tp, err := tracing.NewProvider(t.Context(), tracing.Config{Endpoint: recv.Addr, Insecure: true, SampleRatio: ratio})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tr := tracing.New(tp, "memory")
	c := testutil.NewClock()
	lim, err := sluice.New(tr.Store(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), "memory"), testutil.Snapshot(t, yml), sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return &env{recv: recv, tp: tp, tr: tr, lim: lim}
}

// flush sends every span ended so far and returns all the receiver holds. ForceFlush returns
// once the export call answered, so what is not there was never sent.
func (e *env) flush(t *testing.T) []oteltest.Span {
	t.Helper()
	if err := e.tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	return e.recv.Spans()
}

// decisionAndStore finds the one decision span named name and returns it with its children.
func decisionAndStore(t *testing.T, spans []oteltest.Span, name string) (oteltest.Span, []oteltest.Span) {
	t.Helper()
	d := oteltest.Named(spans, name)
	if len(d) != 1 {
		t.Fatalf("%d %s spans, want 1: %+v", len(d), name, spans)
	}
	return d[0], oteltest.ChildrenOf(spans, d[0].SpanID)
}

// wantAttrs fails for every attribute of want that s lacks or holds otherwise; a want of "*"
// only asks that it be there, "-" that it be absent.
func wantAttrs(t *testing.T, s oteltest.Span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		got, ok := s.Attrs[k]
		switch {
		case v == "-" && ok:
			t.Errorf("%s: %s = %q, want it absent", s.Name, k, got)
		case v == "-":
		case !ok:
			t.Errorf("%s: no attribute %s (have %v)", s.Name, k, s.Attrs)
		case v != "*" && got != v:
			t.Errorf("%s: %s = %q, want %q", s.Name, k, got, v)
		}
	}
}

// checkStoreChild asserts the store call is one child span inside its parent's time.
func checkStoreChild(t *testing.T, parent oteltest.Span, children []oteltest.Span, want map[string]string) {
	t.Helper()
	if len(children) != 1 {
		t.Fatalf("%d children of %s, want the store call: %+v", len(children), parent.Name, children)
	}
	c := children[0]
	if c.Name != tracing.StoreSpan || c.Kind != tracepb.Span_SPAN_KIND_CLIENT || c.TraceID != parent.TraceID {
		t.Errorf("store span %s kind %v trace %s; want %s, client, trace %s", c.Name, c.Kind, c.TraceID, tracing.StoreSpan, parent.TraceID)
	}
	if c.Start.Before(parent.Start) || c.End.After(parent.End) || c.End.Before(c.Start) {
		t.Errorf("store span [%v, %v] not inside the decision's [%v, %v]", c.Start, c.End, parent.Start, parent.End)
	}
	wantAttrs(t, c, want)
}

func post(t *testing.T, url, traceparent, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestHTTPSpans sends checks over real HTTP with a caller's sampled traceparent: with a
// sample ratio of 0, each decision is still traced (parent-based), as a child of the caller's
// span, with the decision's attributes and the store call as its own child.
func TestHTTPSpans(t *testing.T) {
	e := newEnv(t, 0, policyYAML)
	srv := httptest.NewServer(httpapi.New(e.lim, nil, httpapi.Options{Tracer: e.tr}))
	defer srv.Close()
	const secret = "sk-live-secret"
	body := `{"tenant":"acme","user":"alice","api_key":"` + secret + `","ip":"192.0.2.7","endpoint":"/items","method":"GET"}`
	for _, tc := range []struct {
		name, path, body string
		code             int
		span             string
		attrs            map[string]string
		store            bool
	}{
		{"allowed", "/v1/check", body, 200, tracing.CheckSpan, map[string]string{
			"sluice.api": "http", "sluice.allowed": "true", "sluice.state": "normal", "sluice.rule": "per-user",
			"sluice.limits": "1", "sluice.limit": "2", "sluice.remaining": "1", "sluice.degraded": "false",
			"sluice.store": "memory", "sluice.store.calls": "1", "sluice.store.duration_ms": "*",
			"sluice.tenant": "acme", "sluice.user": "alice", "sluice.api_key": key.HashedAPIKey(secret),
			"sluice.ip": "192.0.2.7", "sluice.endpoint": "/items", "sluice.method": "GET", "sluice.policy_version": "*",
			"sluice.retry_after_ms": "-", "error.type": "-",
		}, true},
		{"last one allowed", "/v1/check", body, 200, tracing.CheckSpan, map[string]string{"sluice.allowed": "true", "sluice.remaining": "0"}, true},
		{"denied", "/v1/check", body, 429, tracing.CheckSpan, map[string]string{
			"sluice.allowed": "false", "sluice.state": "hard", "sluice.rule": "per-user", "sluice.retry_after_ms": "3600000", "sluice.reason": "*",
		}, true},
		{"quota", "/v1/quota", body, 200, tracing.QuotaSpan, map[string]string{"sluice.allowed": "true", "sluice.store.calls": "1"}, true},
		{"cost 0 is a look", "/v1/check", `{"user":"bob","cost":0}`, 200, tracing.QuotaSpan, map[string]string{"sluice.user": "bob"}, true},
		{"bad input", "/v1/check", `{"user":null}`, 400, tracing.CheckSpan, map[string]string{
			"error.type": "invalid", "sluice.error": "*", "sluice.store.calls": "0", "sluice.allowed": "-",
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.recv.Reset()
			if code := post(t, srv.URL+tc.path, sampled, tc.body); code != tc.code {
				t.Fatalf("status %d, want %d", code, tc.code)
			}
			spans := e.flush(t)
			d, children := decisionAndStore(t, spans, tc.span)
			if d.TraceID != traceID || d.ParentSpanID != parentID || d.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span trace %s parent %s kind %v; want the caller's trace %s, parent %s, server", d.TraceID, d.ParentSpanID, d.Kind, traceID, parentID)
			}
			wantAttrs(t, d, tc.attrs)
			if d.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("status %v: a decision or the caller's bad input is no server error", d.StatusCode)
			}
			for _, s := range spans {
				for k, v := range s.Attrs {
					if strings.Contains(v, secret) {
						t.Errorf("%s: %s holds the API key: %q", s.Name, k, v)
					}
				}
			}
			if !tc.store {
				if len(children) != 0 {
					t.Errorf("bad input reached the store: %+v", children)
				}
				return
			}
			checkStoreChild(t, d, children, map[string]string{"sluice.store": "memory", "sluice.store.ops": "1"})
			if d.Resource["service.name"] != "sluice" {
				t.Errorf("resource %v: want service.name sluice", d.Resource)
			}
		})
	}
}

// TestSampling: the caller's decision is followed (an unsampled traceparent is never traced,
// whatever the ratio), and calls without a parent are traced at the ratio, as roots.
func TestSampling(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ratio       float64
		traceparent string
		want        int
	}{
		{"ratio 0, no parent", 0, "", 0},
		{"ratio 1, unsampled parent", 1, dropped, 0},
		{"ratio 0, sampled parent", 0, sampled, 1},
		{"ratio 1, no parent", 1, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.ratio, policyYAML)
			srv := httptest.NewServer(httpapi.New(e.lim, nil, httpapi.Options{Tracer: e.tr}))
			defer srv.Close()
			for range 5 {
				post(t, srv.URL+"/v1/check", tc.traceparent, `{"user":"u"}`)
			}
			spans := e.flush(t)
			if got := len(oteltest.Named(spans, tracing.CheckSpan)); got != 5*tc.want {
				t.Fatalf("%d decision spans, want %d: %+v", got, 5*tc.want, spans)
			}
			if tc.want == 0 {
				if len(spans) != 0 || e.recv.Exports() != 0 {
					t.Fatalf("%d spans in %d exports, want none", len(spans), e.recv.Exports())
				}
				return
			}
			for _, s := range oteltest.Named(spans, tracing.CheckSpan) {
				if tc.traceparent == "" && s.ParentSpanID != "" {
					t.Errorf("a call without traceparent has parent %s", s.ParentSpanID)
				}
			}
			if got := len(oteltest.Named(spans, tracing.StoreSpan)); got != 5 {
				t.Errorf("%d store spans, want 5", got)
			}
		})
	}
}

// outgoing is a client context carrying traceparent in its gRPC metadata, as Envoy and
// otelgrpc send it.
func outgoing(t *testing.T, traceparent string) context.Context {
	return metadata.AppendToOutgoingContext(t.Context(), "traceparent", traceparent)
}

// TestGRPCSpans calls sluice.v1 Check and GetQuota over real gRPC with traceparent metadata.
func TestGRPCSpans(t *testing.T) {
	e := newEnv(t, 0, policyYAML)
	srv := grpcapi.New(e.lim, nil, grpcapi.WithTracer(e.tr))
	client := sluicev1.NewRateLimiterClient(grpctest.Serve(t, srv.Register))
	for _, tc := range []struct {
		name  string
		call  func(ctx context.Context) error
		span  string
		attrs map[string]string
		store bool
	}{
		{"check", func(ctx context.Context) error {
			_, err := client.Check(ctx, &sluicev1.CheckRequest{Tenant: "acme", User: "alice"})
			return err
		}, tracing.CheckSpan, map[string]string{"sluice.api": "grpc", "sluice.rule": "per-user", "sluice.state": "normal", "sluice.allowed": "true", "sluice.store": "memory", "sluice.tenant": "acme"}, true},
		{"get quota", func(ctx context.Context) error {
			_, err := client.GetQuota(ctx, &sluicev1.CheckRequest{Tenant: "acme", User: "alice"})
			return err
		}, tracing.QuotaSpan, map[string]string{"sluice.api": "grpc", "sluice.remaining": "1"}, true},
		{"bad input", func(ctx context.Context) error {
			c := int64(-1)
			if _, err := client.Check(ctx, &sluicev1.CheckRequest{User: "alice", Cost: &c}); err == nil {
				t.Error("a negative cost was accepted")
			}
			return nil
		}, tracing.CheckSpan, map[string]string{"error.type": "invalid"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.recv.Reset()
			if err := tc.call(outgoing(t, sampled)); err != nil {
				t.Fatal(err)
			}
			d, children := decisionAndStore(t, e.flush(t), tc.span)
			if d.TraceID != traceID || d.ParentSpanID != parentID {
				t.Errorf("trace %s parent %s, want %s %s", d.TraceID, d.ParentSpanID, traceID, parentID)
			}
			wantAttrs(t, d, tc.attrs)
			if tc.store {
				checkStoreChild(t, d, children, map[string]string{"sluice.store": "memory"})
			} else if len(children) != 0 {
				t.Errorf("children %+v, want none", children)
			}
		})
	}
}

// TestRLSSpans calls Envoy's ShouldRateLimit over real gRPC with traceparent metadata, and
// the reference's /json endpoint with a traceparent header: descriptor values stay out of
// the span.
func TestRLSSpans(t *testing.T) {
	e := newEnv(t, 0, envoyYAML)
	srv := rls.New(e.lim, nil, rls.Options{Tracer: e.tr})
	client := rlsv3.NewRateLimitServiceClient(grpctest.Serve(t, func(gs *grpc.Server) { srv.Register(gs) }))
	const secretValue = "client-secret-value"
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "client_id", Value: secretValue}}},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "unknown", Value: "x"}}},
	}}
	for i, want := range []map[string]string{
		{"sluice.api": "rls", "sluice.domain": "edge", "sluice.descriptors": "2", "sluice.limits": "1", "sluice.allowed": "true", "sluice.state": "normal", "sluice.rule": "*", "sluice.remaining": "0", "sluice.store": "memory", "sluice.store.calls": "1"},
		{"sluice.allowed": "false", "sluice.state": "hard"},
	} {
		e.recv.Reset()
		if _, err := client.ShouldRateLimit(outgoing(t, sampled), req); err != nil {
			t.Fatal(err)
		}
		spans := e.flush(t)
		d, children := decisionAndStore(t, spans, tracing.CheckSpan)
		if d.TraceID != traceID || d.ParentSpanID != parentID {
			t.Errorf("call %d: trace %s parent %s, want %s %s", i, d.TraceID, d.ParentSpanID, traceID, parentID)
		}
		wantAttrs(t, d, want)
		checkStoreChild(t, d, children, map[string]string{"sluice.store": "memory", "sluice.store.ops": "1"})
		for _, s := range spans {
			for k, v := range s.Attrs {
				if strings.Contains(v, secretValue) {
					t.Errorf("%s: %s holds a descriptor value: %q", s.Name, k, v)
				}
			}
		}
	}

	e.recv.Reset()
	h := httptest.NewServer(srv.JSONHandler(0))
	defer h.Close()
	if code := post(t, h.URL+"/json", sampled, `{"domain":"edge","descriptors":[{"entries":[{"key":"client_id","value":"c2"}]}]}`); code != 200 {
		t.Fatalf("/json: status %d", code)
	}
	d, children := decisionAndStore(t, e.flush(t), tracing.CheckSpan)
	if d.TraceID != traceID || d.ParentSpanID != parentID {
		t.Errorf("/json: trace %s parent %s, want %s %s", d.TraceID, d.ParentSpanID, traceID, parentID)
	}
	wantAttrs(t, d, map[string]string{"sluice.api": "rls", "sluice.allowed": "true"})
	checkStoreChild(t, d, children, map[string]string{"sluice.store": "memory"})
}

// TestIdempotencyMismatch: a reused key is the caller's mistake: error.type says so, on the
// decision and the store call, and neither span is an error.
func TestIdempotencyMismatch(t *testing.T) {
	e := newEnv(t, 1, policyYAML)
	srv := httptest.NewServer(httpapi.New(e.lim, nil, httpapi.Options{Tracer: e.tr}))
	defer srv.Close()
	post(t, srv.URL+"/v1/check", "", `{"user":"u","idempotency_key":"k1"}`)
	e.flush(t)
	e.recv.Reset()
	if code := post(t, srv.URL+"/v1/check", "", `{"user":"u","idempotency_key":"k1","cost":2}`); code != 422 {
		t.Fatalf("status %d, want 422", code)
	}
	d, children := decisionAndStore(t, e.flush(t), tracing.CheckSpan)
	wantAttrs(t, d, map[string]string{"error.type": "idempotency_mismatch", "sluice.store.calls": "1"})
	checkStoreChild(t, d, children, map[string]string{"error.type": "idempotency_mismatch"})
	for _, s := range append(children, d) {
		if s.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s: status error for the caller's mistake", s.Name)
		}
	}
}

// TestNilTracer: with tracing off the servers take a nil Tracer, which starts nothing, and
// the store is left unwrapped.
func TestNilTracer(t *testing.T) {
	var tr *tracing.Tracer
	ctx := context.Background()
	got, sp := tr.StartHTTP(ctx, http.Header{"Traceparent": {sampled}}, "http", tracing.CheckSpan)
	if got != ctx || sp != nil {
		t.Fatalf("nil Tracer returned %v, %v", got, sp)
	}
	sp.Look()
	sp.EndCheck(nil, nil, nil)
	sp.EndDescriptors(nil, nil, nil)
	st := memory.New()
	defer st.Close()
	if tr.Store(st, "memory") != st || tr.Fallback(st) != st {
		t.Fatal("a nil Tracer wrapped the store")
	}
}

// TestStoreDown kills a real Redis under the limiter: the decision span says degraded, the
// Redis call is an error child span, and a rule with on_store_error: local adds a second
// child, the fallback's.
func TestStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	recv := oteltest.Start(t)
	tp, err := tracing.NewProvider(t.Context(), tracing.Config{Endpoint: recv.Addr, Insecure: true, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	tr := tracing.New(tp, "redis")
	st, err := redisstore.New(t.Context(), "redis://"+srv.Addr, redisstore.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(tr.Store(st, "redis"), testutil.Snapshot(t, `
rules:
  - {name: open, match: {endpoint: /open}, key: [user], algorithm: fixed_window, limit: 5, period: 1h, on_store_error: open}
  - {name: local, match: {endpoint: /local}, key: [user], algorithm: fixed_window, limit: 5, period: 1h, on_store_error: local}
`), sluice.WithFallback(tr.Fallback(memory.New(memory.WithSweepInterval(0)))))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := httptest.NewServer(httpapi.New(lim, nil, httpapi.Options{Tracer: tr}))
	defer h.Close()
	flush := func() []oteltest.Span {
		t.Helper()
		if err := tp.ForceFlush(t.Context()); err != nil {
			t.Fatal(err)
		}
		spans := recv.Spans()
		recv.Reset()
		return spans
	}

	post(t, h.URL+"/v1/check", "", `{"user":"u","endpoint":"/open"}`)
	d, children := decisionAndStore(t, flush(), tracing.CheckSpan)
	wantAttrs(t, d, map[string]string{"sluice.degraded": "false", "sluice.store": "redis", "sluice.store.fallback": "-"})
	checkStoreChild(t, d, children, map[string]string{"sluice.store": "redis", "error.type": "-"})

	srv.Kill()
	for _, tc := range []struct {
		endpoint string
		children int
	}{{"/open", 1}, {"/local", 2}} {
		if code := post(t, h.URL+"/v1/check", "", `{"user":"u","endpoint":"`+tc.endpoint+`"}`); code != 200 {
			t.Fatalf("%s with Redis down: status %d", tc.endpoint, code)
		}
		d, children := decisionAndStore(t, flush(), tracing.CheckSpan)
		wantAttrs(t, d, map[string]string{"sluice.degraded": "true", "sluice.allowed": "true", "sluice.store.calls": strconv.Itoa(tc.children)})
		if d.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s: a degraded decision is still an answer, not an error span", tc.endpoint)
		}
		if len(children) != tc.children {
			t.Fatalf("%s: %d store spans, want %d: %+v", tc.endpoint, len(children), tc.children, children)
		}
		redis := children[0]
		if redis.Attrs["sluice.store"] != "redis" || redis.StatusCode != tracepb.Status_STATUS_CODE_ERROR || redis.Attrs["error.type"] != "unavailable" {
			t.Errorf("%s: first store span %+v, want redis with status error, error.type unavailable", tc.endpoint, redis)
		}
		if tc.children == 2 {
			wantAttrs(t, d, map[string]string{"sluice.store.fallback": "true"})
			wantAttrs(t, children[1], map[string]string{"sluice.store": "memory", "sluice.store.fallback": "true", "error.type": "-"})
		}
	}
}
