package redis

import (
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store"
)

// BenchmarkApply measures one request of 1 and 4 limits through the store against a local
// redis-server, with 50 callers at once (b.SetParallelism over GOMAXPROCS), with and without
// coalescing: allocations per request, and the mean number of requests a script call decided.
//
//	go test -run '^$' -bench BenchmarkApply -benchtime 2s ./store/redis/
func BenchmarkApply(b *testing.B) {
	srv := redistest.Start(b)
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000_000, 0, time.Second)
	for _, coalesce := range []bool{true, false} {
		st, err := New(ctx, "redis://"+srv.Addr, WithCoalescing(coalesce))
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("coalesce=%v/%dlimits", coalesce, n), func(b *testing.B) {
				var next atomic.Int64
				calls0, batches0 := st.CoalesceStats()
				b.ReportAllocs()
				b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					user := strconv.FormatInt(next.Add(1), 10)
					ops := make([]store.Op, n)
					for i := range ops {
						// The first limit is the caller's, the others global, as a request
						// under per-user, per-tenant, per-endpoint and global rules.
						k := key.AppendHead(nil, "rule"+strconv.Itoa(i), "1")
						if i == 0 {
							k = key.AppendTag(k, 'u', user)
						}
						ops[i] = store.Op{Key: k, Params: &p, Cost: 1}
					}
					batch := &store.Batch{Ops: ops}
					res := make([]algorithm.Result, n)
					for pb.Next() {
						if _, err := st.Apply(ctx, batch, res); err != nil {
							b.Error(err)
							return
						}
					}
				})
				if calls, batches := st.CoalesceStats(); calls > calls0 {
					b.ReportMetric(float64(batches-batches0)/float64(calls-calls0), "reqs/call")
				}
			})
		}
		st.Close()
	}
}
