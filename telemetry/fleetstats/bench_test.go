package fleetstats

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/telemetry/usage"
)

// BenchmarkObserve is the cost the dashboard adds to the decision recorder's gathering
// goroutine per limit of a counted decision: that goroutine's speed bounds the decisions per
// second a node counts without dropping (telemetry/usage, Options.Poll).
func BenchmarkObserve(b *testing.B) {
	c := New(Options{Node: "n1", Store: "memory"})
	obs := make([]usage.Observation, 1024)
	for i := range obs {
		obs[i] = usage.Observation{Rule: fmt.Sprintf("rule-%d", i%4), Tenant: "acme", User: fmt.Sprintf("user-%d", i%300)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.Observe(obs[i%len(obs)])
	}
}
