package events_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/testutil"
	"github.com/sluicehq/sluice/server/events"
)

// BenchmarkRecord is what the hot path pays per decision for the counts: one event queued,
// with the recorder gathering on another goroutine (the queue is sized so nothing drops).
// The decision has a denied and an allowed limit, so the gatherer makes a violation row too.
func BenchmarkRecord(b *testing.B) {
	st, _ := backends[0].open(b, control.Options{})
	rec := newRecorder(b, events.Options{Store: st, Flush: time.Second})
	l := testutil.Limiter(b, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1000000000, period: 1h}
`, testutil.NewClock())
	req := sluice.Request{Tenant: "acme", User: "u1", APIKey: "sk-1", IP: "192.0.2.1", Endpoint: "/api/items"}
	var d sluice.Decision
	for range 2 {
		r := req
		if err := l.Check(b.Context(), &r, &d); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec.Check(&req, &d)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rec.Check(&req, &d)
			}
		})
	})
	flush(b, rec)
	b.Logf("stats: %+v", rec.Stats())
}

// BenchmarkAddCounts writes one flush of 100K identities' violations and the usage rows of
// their 1,000 tenants (101,000 rows) to each database: into a fresh minute (inserts), then
// into the same minute again (updates), as a node's first and later flushes of a minute are.
func BenchmarkAddCounts(b *testing.B) {
	const identities, tenants = 100_000, 1_000
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			st, _ := be.open(b, control.Options{})
			minute := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
			batch := func(m time.Time) ([]control.UsageCount, []control.ViolationCount) {
				u := make([]control.UsageCount, tenants)
				for i := range u {
					u[i] = control.UsageCount{Minute: m, Rule: "per-user", Tenant: fmt.Sprintf("t%d", i), Allowed: 90, Denied: 10}
				}
				v := make([]control.ViolationCount, identities)
				for i := range v {
					v[i] = control.ViolationCount{Minute: m, Rule: "per-user", Tenant: fmt.Sprintf("t%d", i%tenants), User: fmt.Sprintf("u%d", i),
						IP: "192.0.2.1", Endpoint: "/api/items", Denied: 1, Limit: 100}
				}
				return u, v
			}
			for _, mode := range []string{"insert", "update"} {
				b.Run(mode, func(b *testing.B) {
					for b.Loop() {
						if mode == "insert" {
							minute = minute.Add(time.Minute)
						}
						u, v := batch(minute)
						if err := st.AddCounts(b.Context(), u, v); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(identities+tenants)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
				})
			}
		})
	}
}
