package e2e

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit/oteltest"
)

// traceparent is a caller's sampled span in W3C form.
func traceparent(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// TestTracesReachTheCollector runs the binary with --otlp-endpoint at an in-process OTLP
// receiver and a sample ratio of 0, and calls it over HTTP, sluice.v1 gRPC and Envoy RLS, each
// with a caller's sampled trace, plus calls with no trace and with an unsampled one. The
// batch processor is told to wait a minute, so the spans arrive only because SIGTERM flushes
// them: exactly one decision span per traced call, in the caller's trace, under the caller's
// span, with the store call as its child; nothing for the others.
func TestTracesReachTheCollector(t *testing.T) {
	t.Parallel()
	recv := oteltest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "native.yaml"), nativePolicy)
	writeFile(t, filepath.Join(dir, "envoy.yaml"), envoyPolicy)
	s := startWith(t, binary, dir, filepath.Join(dir, "data"),
		[]string{"--otlp-endpoint", recv.Addr, "--otlp-insecure", "--trace-sample-ratio", "0", "--node-id", "node-a"},
		http.DefaultClient, "http", "OTEL_BSP_SCHEDULE_DELAY=60000")

	const (
		httpTrace, httpParent = "11111111111111111111111111111111", "1111111111111111"
		grpcTrace, grpcParent = "22222222222222222222222222222222", "2222222222222222"
		rlsTrace, rlsParent   = "33333333333333333333333333333333", "3333333333333333"
	)
	post := func(tp, body string) int {
		req, _ := http.NewRequest("POST", "http://"+s.http+"/v1/check", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if tp != "" {
			req.Header.Set("Traceparent", tp)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(traceparent(httpTrace, httpParent), `{"tenant":"acme","user":"bo","api_key":"sk-e2e-secret"}`); code != 200 {
		t.Fatalf("traced HTTP check: %d", code)
	}
	post("", `{"tenant":"acme","user":"untraced"}`)
	post("00-44444444444444444444444444444444-4444444444444444-00", `{"tenant":"acme","user":"unsampled"}`)

	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	withTrace := func(tp string) context.Context { return metadata.AppendToOutgoingContext(ctx, "traceparent", tp) }
	if _, err := sluicev1.NewRateLimiterClient(conn).Check(withTrace(traceparent(grpcTrace, grpcParent)), &sluicev1.CheckRequest{Tenant: "acme", User: "bo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sluicev1.NewRateLimiterClient(conn).Check(ctx, &sluicev1.CheckRequest{Tenant: "acme", User: "untraced"}); err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.9"}}},
	}}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(withTrace(traceparent(rlsTrace, rlsParent)), req); err != nil {
		t.Fatal(err)
	}
	if n := recv.Exports(); n != 0 {
		t.Fatalf("%d exports before shutdown; the test needs the batch to wait", n)
	}
	s.stop()

	spans := recv.Spans()
	decisions := oteltest.Named(spans, "sluice.check")
	if len(decisions) != 3 || len(spans) != 6 {
		t.Fatalf("%d decision spans of %d, want 3 of 6 (3 decisions, 3 store calls): %+v", len(decisions), len(spans), spans)
	}
	for _, tc := range []struct {
		trace, parent string
		attrs         map[string]string
	}{
		{httpTrace, httpParent, map[string]string{"sluice.api": "http", "sluice.rule": "per-user", "sluice.state": "normal", "sluice.user": "bo", "sluice.tenant": "acme"}},
		{grpcTrace, grpcParent, map[string]string{"sluice.api": "grpc", "sluice.rule": "per-user", "sluice.state": "normal", "sluice.remaining": "3"}},
		{rlsTrace, rlsParent, map[string]string{"sluice.api": "rls", "sluice.domain": "edge", "sluice.rule": "per-ip", "sluice.state": "normal"}},
	} {
		var d *oteltest.Span
		for i := range decisions {
			if decisions[i].TraceID == tc.trace {
				d = &decisions[i]
			}
		}
		if d == nil {
			t.Errorf("no decision span in trace %s: %+v", tc.trace, decisions)
			continue
		}
		if d.ParentSpanID != tc.parent || d.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("trace %s: parent %s kind %v, want %s, server", tc.trace, d.ParentSpanID, d.Kind, tc.parent)
		}
		tc.attrs["sluice.allowed"], tc.attrs["sluice.limits"], tc.attrs["sluice.store"], tc.attrs["sluice.store.calls"] = "true", "1", "memory", "1"
		for k, v := range tc.attrs {
			if d.Attrs[k] != v {
				t.Errorf("trace %s: %s = %q, want %q (all: %v)", tc.trace, k, d.Attrs[k], v, d.Attrs)
			}
		}
		if d.Attrs["sluice.store.duration_ms"] == "" {
			t.Errorf("trace %s: no store time: %v", tc.trace, d.Attrs)
		}
		children := oteltest.ChildrenOf(spans, d.SpanID)
		if len(children) != 1 || children[0].Name != "sluice.store" || children[0].TraceID != tc.trace || children[0].Attrs["sluice.store"] != "memory" {
			t.Errorf("trace %s: children %+v, want the memory store's call", tc.trace, children)
		}
		if r := d.Resource; r["service.name"] != "sluice" || r["service.instance.id"] != "node-a" || r["service.version"] == "" {
			t.Errorf("resource %v: want service.name sluice, instance node-a, a version", r)
		}
	}
	for _, sp := range spans {
		for k, v := range sp.Attrs {
			if strings.Contains(v, "sk-e2e-secret") {
				t.Errorf("%s: %s holds the API key", sp.Name, k)
			}
		}
	}
	if !strings.Contains(s.log.String(), "sending traces over OTLP/gRPC") {
		t.Errorf("the log does not say where traces go:\n%s", s.log)
	}
}

// TestTracingFromStandardVariables: the standard OTEL_* variables alone turn tracing on, the
// endpoint's http:// scheme meaning plaintext and OTEL_TRACES_SAMPLER=always_on tracing calls
// that bring no trace, as roots; OTEL_SDK_DISABLED=true turns it off again, and a node told
// nothing sends nothing.
func TestTracingFromStandardVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  func(addr string) []string
		want int
	}{
		{"on", func(addr string) []string {
			return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr, "OTEL_TRACES_SAMPLER=always_on", "OTEL_SERVICE_NAME=edge-limiter"}
		}, 2},
		{"sdk disabled", func(addr string) []string {
			return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr, "OTEL_TRACES_SAMPLER=always_on", "OTEL_SDK_DISABLED=true"}
		}, 0},
		{"not configured", func(string) []string { return nil }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			recv := oteltest.Start(t)
			dir := t.TempDir()
			s := start(t, "", filepath.Join(dir, "data"), tc.env(recv.Addr)...)
			if code, _, _ := s.post("/v1/check", `{"user":"root-call"}`); code != 200 {
				t.Fatalf("check: %d", code)
			}
			s.stop()
			spans := recv.Spans()
			if len(spans) != tc.want {
				t.Fatalf("%d spans, want %d: %+v", len(spans), tc.want, spans)
			}
			if tc.want == 0 {
				if recv.Exports() != 0 {
					t.Fatalf("%d exports, want none", recv.Exports())
				}
				return
			}
			d := oteltest.Named(spans, "sluice.check")
			if len(d) != 1 || d[0].ParentSpanID != "" || d[0].Resource["service.name"] != "edge-limiter" {
				t.Fatalf("decision spans %+v, want one root span of service edge-limiter", d)
			}
		})
	}
}

// TestServeRejectsBadTracingFlags: each bad value stops serve with an error naming its flag
// or variable, before it touches its data dir.
func TestServeRejectsBadTracingFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--trace-sample-ratio=2"}, "", "--trace-sample-ratio"},
		{[]string{"--otlp-endpoint=127.0.0.1:4317", "--trace-sample-ratio=abc"}, "", "--trace-sample-ratio"},
		{[]string{"--otlp-endpoint=collector"}, "", "--otlp-endpoint"},
		{[]string{"--otlp-endpoint=ftp://collector:4317"}, "", "--otlp-endpoint"},
		{[]string{"--otlp-ca=/nonexistent.pem"}, "", "--otlp-ca"},
		{[]string{"--otlp-endpoint=127.0.0.1:4317", "--otlp-cert=/nonexistent.pem"}, "", "--otlp-cert"},
		{nil, "OTEL_EXPORTER_OTLP_ENDPOINT=collector", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{[]string{"--otlp-endpoint=127.0.0.1:4317"}, "OTEL_TRACES_SAMPLER=sometimes", "OTEL_TRACES_SAMPLER"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dataDir := filepath.Join(t.TempDir(), "data")
		args := append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", dataDir}, c.args...)
		cmd := exec.CommandContext(ctx, binary, args...)
		if c.env != "" {
			cmd.Env = append(cmd.Environ(), c.env)
		}
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("serve %v %s: %v, output %q; want a failure naming %s", c.args, c.env, err, out, c.want)
		}
		// Refused before anything is opened: no data dir, control store or admin token.
		if _, err := os.Stat(dataDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("serve %v %s: left %s behind (%v)", c.args, c.env, dataDir, err)
		}
	}
}
