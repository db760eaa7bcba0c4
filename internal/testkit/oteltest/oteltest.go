// Package oteltest runs an OTLP/gRPC trace receiver in the test's process, on loopback, so that
// tests see the spans a real exporter sends over the wire rather than an SDK's in-memory copy.
package oteltest

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Span is one received span with what tests ask of it flattened: ids in hex, attributes as
// strings (bools "true"/"false", integers in decimal).
type Span struct {
	Name         string
	TraceID      string
	SpanID       string
	ParentSpanID string
	Kind         tracepb.Span_SpanKind
	Start, End   time.Time
	Attrs        map[string]string
	// Resource holds the attributes of the resource that sent the span (service.name, ...).
	Resource map[string]string
	// StatusCode and StatusMessage are the span's status.
	StatusCode    tracepb.Status_StatusCode
	StatusMessage string
}

// Receiver is an OTLP/gRPC trace collector that keeps every span it is sent.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer

	// Addr is the receiver's host:port on loopback.
	Addr string

	mu      sync.Mutex
	spans   []Span
	exports int
}

// Start serves a Receiver in plaintext on a free loopback port until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	return StartTLS(t, nil)
}

// StartTLS is Start over TLS with cfg (with ClientCAs and ClientAuth for mutual TLS); a nil
// cfg serves plaintext.
func StartTLS(t testing.TB, cfg *tls.Config) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: ln.Addr().String()}
	var opts []grpc.ServerOption
	if cfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(opts...)
	collectortrace.RegisterTraceServiceServer(gs, r)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("oteltest: serve: %v", err)
		}
	})
	return r
}

// Export keeps the spans of req.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, Span{
					Name: s.GetName(), Kind: s.GetKind(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
					Start:        time.Unix(0, int64(s.GetStartTimeUnixNano())),
					End:          time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs:        attrs(s.GetAttributes()), Resource: res,
					StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
				})
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.exports++
	r.mu.Unlock()
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns a copy of every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Reset forgets the spans and exports received so far.
func (r *Receiver) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans, r.exports = nil, 0
}

// Exports returns how many export calls arrived, empty ones included.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// Named returns the spans of spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// ChildrenOf returns the spans of spans whose parent is the span with id parent.
func ChildrenOf(spans []Span, parent string) []Span {
	var out []Span
	for _, s := range spans {
		if s.ParentSpanID == parent {
			out = append(out, s)
		}
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = valueString(kv.GetValue())
	}
	return m
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	}
	return v.String()
}
