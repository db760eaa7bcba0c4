package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/sqlite"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// This file is in the external test package because node, whose usage writer
// BenchmarkCheckHandlerEvents counts through, imports httpapi.

// BenchmarkCheckHandler measures POST /v1/check through the handler without the network, on
// bodies like bench/check.lua's (user and tenant vary, so no reader can serve them from a cache
// of recent strings): decoding, the decision over the memory store, headers and the JSON
// answer. The request is reused; only its body is rewound.
func BenchmarkCheckHandler(b *testing.B) { benchmarkCheckHandler(b, httpapi.Options{}) }

// BenchmarkCheckHandlerEvents is BenchmarkCheckHandler with the decisions counted for the
// violations log and usage history (telemetry/usage) into a SQLite control store.
func BenchmarkCheckHandlerEvents(b *testing.B) {
	st, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "control.db"), control.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	rec, err := usage.New(usage.Options{Writer: node.UsageWriter(st)})
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close(context.Background())
	benchmarkCheckHandler(b, httpapi.Options{Events: rec})
	if s := rec.Stats(); s.Dropped > 0 {
		b.Logf("events dropped: %d", s.Dropped)
	}
}

func benchmarkCheckHandler(b *testing.B, o httpapi.Options) {
	s := httpapi.New(testutil.Limiter(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: gcra, limit: 1000000000, period: 1s}
`, testutil.NewClock()), nil, o)
	bodies := make([][]byte, 4096)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"user":"u%d","tenant":"t%d","endpoint":"/api/items","method":"GET"}`, i*7919%100000, i%1000)
	}
	rd := bytes.NewReader(nil)
	r := httptest.NewRequest("POST", "/v1/check", nil)
	r.Body = io.NopCloser(rd)
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
}
