package rls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/transport/rls"
)

// BenchmarkShouldRateLimit measures the handler without the network: Envoy's typical request
// of a few descriptors, one of them nested.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts rls.Options
	}{
		{"plain", rls.Options{}},
		{"headers", rls.Options{ResponseHeaders: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv, _ := newServer(b, bc.opts, nil)
			in := edge(desc("client_id", "internal"), desc("path", "/health"), desc("tenant", "acme", "quota", "daily"))
			// A limit no benchmark run can exhaust, so every iteration does the same work.
			in.Descriptors[2] = descLimit(4e9, typev3.RateLimitUnit_DAY, in.Descriptors[2])
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := srv.ShouldRateLimit(b.Context(), in)
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Fatal(resp, err)
					}
				}
			})
		})
	}
}
