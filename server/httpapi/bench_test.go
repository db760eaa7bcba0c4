package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/internal/testutil"
)

// BenchmarkCheckHandler measures POST /v1/check through the handler without the network, on
// bodies like bench/check.lua's (user and tenant vary, so no reader can serve them from a cache
// of recent strings): decoding, the decision over the memory store, headers and the JSON
// answer. The request is reused; only its body is rewound.
func BenchmarkCheckHandler(b *testing.B) {
	s := New(testutil.Limiter(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: gcra, limit: 1000000000, period: 1s}
`, testutil.NewClock()), nil, Options{})
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
