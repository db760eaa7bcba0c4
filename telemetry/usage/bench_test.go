package usage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/node"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// BenchmarkRecord is what the hot path pays per decision for the counts: one event queued.
// The decision has a denied and an allowed limit, so the gatherer makes a violation row too.
//
//   - serial: the send alone. The gatherer polls rarely, and the queue is emptied outside the
//     timer whenever it is full, so no send drops (a drop is cheaper than a send).
//   - contended: two goroutines send while the gatherer empties the queue every 10 ms, as in
//     a server; sends past what the gatherer keeps up with drop, reported as dropped/op. A
//     real decision takes microseconds, so a server sends far slower than this loop.
func BenchmarkRecord(b *testing.B) {
	st, _ := backends[0].open(b, control.Options{})
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
		recordSerially(b, st, 1, func(rec *usage.Recorder) { rec.Check(&req, &d) })
	})
	b.Run("contended", func(b *testing.B) {
		rec := newRecorder(b, usage.Options{Writer: node.UsageWriter(st)})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rec.Check(&req, &d)
			}
		})
		b.ReportMetric(float64(rec.Stats().Dropped)/float64(b.N), "dropped/op")
	})
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

// BenchmarkRecordDescriptors is BenchmarkRecord's serial case for an Envoy request of four
// descriptors under four limits (the shared bench's shape).
func BenchmarkRecordDescriptors(b *testing.B) {
	st, _ := backends[0].open(b, control.Options{})
	l := testutil.Limiter(b, `
domain: bench
descriptors:
  - {key: user, rate_limit: {unit: second, requests_per_unit: 1000}}
  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 100000}}
  - {key: endpoint, rate_limit: {unit: second, requests_per_unit: 1000000}}
  - {key: global, rate_limit: {unit: second, requests_per_unit: 100000000}}
`, testutil.NewClock())
	req := sluice.DescriptorRequest{Domain: "bench", Descriptors: []sluice.Descriptor{
		desc("user", "u1"), desc("tenant", "t1"), desc("endpoint", "/e1"), desc("global", "all")}}
	var d sluice.DescriptorDecision
	if err := l.CheckDescriptors(b.Context(), &req, &d); err != nil {
		b.Fatal(err)
	}
	recordSerially(b, st, 4, func(rec *usage.Recorder) { rec.Descriptors(&req, &d) })
}

// recordSerially times record, which queues at most perCall events, on a recorder whose
// gatherer polls rarely: the queue is emptied outside the timer whenever it could fill, so no
// event drops (a drop is cheaper than a send).
func recordSerially(b *testing.B, st control.Store, perCall int, record func(*usage.Recorder)) {
	b.Helper()
	const queue = 1 << 16
	rec := newRecorder(b, usage.Options{Writer: node.UsageWriter(st), Queue: queue, Poll: time.Hour})
	calls := queue / perCall
	b.ReportAllocs()
	for i := range b.N {
		if i%calls == calls-1 {
			b.StopTimer()
			flush(b, rec)
			b.StartTimer()
		}
		record(rec)
	}
	b.StopTimer()
	if s := rec.Stats(); s.Dropped > 0 {
		b.Fatalf("%d events dropped", s.Dropped)
	}
}
