package tracing_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/oteltest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/telemetry/tracing"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// BenchmarkHTTPCheck measures POST /v1/check through the handler (as httpapi's
// BenchmarkCheckHandler does) with tracing off, on with the call not sampled (no traceparent,
// ratio 0: what most calls cost at the default ratio), and on with a caller's sampled trace,
// exported over OTLP/gRPC to an in-process receiver. Its off case allocates exactly what
// httpapi's benchmark does on a build without tracing (README, Deploy: observability).
func BenchmarkHTTPCheck(b *testing.B) {
	for _, bc := range []struct {
		name        string
		on          bool
		ratio       float64
		traceparent string
	}{
		{"off", false, 0, ""},
		{"on/unsampled", true, 0, ""},
		{"on/sampled", true, 0, sampled},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var tr *tracing.Tracer
			if bc.on {
				recv := oteltest.Start(b)
				tp, err := tracing.NewProvider(b.Context(), tracing.Config{Endpoint: recv.Addr, Insecure: true, SampleRatio: bc.ratio})
				if err != nil {
					b.Fatal(err)
				}
				defer tp.Shutdown(context.Background())
				tr = tracing.New(tp, "memory")
			}
			c := testutil.NewClock()
			lim, err := sluice.New(tr.Store(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), "memory"), testutil.Snapshot(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: gcra, limit: 1000000000, period: 1s}
`), sluice.WithClock(c.Now))
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close()
			s := httpapi.New(lim, nil, httpapi.Options{Tracer: tr})
			bodies := make([][]byte, 4096)
			for i := range bodies {
				bodies[i] = fmt.Appendf(nil, `{"user":"u%d","tenant":"t%d","endpoint":"/api/items","method":"GET"}`, i*7919%100000, i%1000)
			}
			rd := bytes.NewReader(nil)
			r := httptest.NewRequest("POST", "/v1/check", nil)
			r.Body = io.NopCloser(rd)
			if bc.traceparent != "" {
				r.Header.Set("Traceparent", bc.traceparent)
			}
			w := testutil.NewDiscardWriter()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rd.Reset(bodies[i%len(bodies)])
				i++
				clear(w.Header())
				w.Code = 0
				s.ServeHTTP(w, r)
				if w.Code != 0 {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
