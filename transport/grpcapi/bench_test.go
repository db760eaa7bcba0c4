package grpcapi

import (
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// BenchmarkCheckHandler measures the handler without the network: what the server adds to the
// engine is the request conversion and the response message (the Decision is pooled).
func BenchmarkCheckHandler(b *testing.B) {
	l, _ := newLimiter(b, `
rules:
  - {name: per-user, key: [user], algorithm: gcra, limit: 1000000000, period: 1s}
  - {name: per-tenant, key: [tenant], algorithm: token_bucket, limit: 1000000000, period: 1s}
`)
	s := New(l, nil)
	r := &sluicev1.CheckRequest{Tenant: "acme", User: "alice", Endpoint: "/api/items"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Check(b.Context(), r); err != nil {
			b.Fatal(err)
		}
	}
}
