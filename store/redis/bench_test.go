package redis

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/breaker"
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
		// guarded is the store as serve uses it: behind the breaker and its deadline.
		guarded := breaker.New(st, breaker.Options{Timeout: 100 * time.Millisecond})
		for _, c := range []struct {
			name string
			n    int
			st   store.Store
		}{{"1limits", 1, st}, {"4limits", 4, st}, {"4limits-guarded", 4, guarded}} {
			n := c.n
			b.Run(fmt.Sprintf("coalesce=%v/%s", coalesce, c.name), func(b *testing.B) {
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
						if _, err := c.st.Apply(ctx, batch, res); err != nil {
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

// BenchmarkRedisCPU measures Redis's own CPU per request (INFO cpu, used_cpu_user and
// used_cpu_sys: script execution and network work alike) for the load shape of
// scripts/redisbench.sh: fixed windows of 1 s, one limit per descriptor (100K users, 1,000
// tenants, 100 endpoints, one global), 50 callers, coalescing on. Redis's CPU is counted by
// Redis itself, so the figure holds up on a busy machine better than a rate does.
//
//	go test -run '^$' -bench BenchmarkRedisCPU -benchtime 100000x ./store/redis/
func BenchmarkRedisCPU(b *testing.B) {
	srv := redistest.Start(b)
	st, err := New(ctx, "redis://"+srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	limits := []struct {
		rule   string
		tag    byte
		values int
		limit  int64
	}{{"user", 'u', 100_000, 1000}, {"tenant", 't', 1000, 100_000}, {"endpoint", 'e', 100, 1_000_000}, {"global", 0, 1, 100_000_000}}
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("%dlimits", n), func(b *testing.B) {
			params := make([]algorithm.Params, n)
			for i := range params {
				params[i], _ = algorithm.NewParams(algorithm.FixedWindow, limits[i].limit, 0, time.Second)
			}
			cpu0 := redisCPU(b, srv)
			calls0, batches0 := st.CoalesceStats()
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				ops := make([]store.Op, n)
				batch := &store.Batch{Ops: ops}
				res := make([]algorithm.Result, n)
				for pb.Next() {
					x := next.Add(7919)
					for i := range ops {
						k := key.AppendHead(nil, limits[i].rule, "1")
						if limits[i].tag != 0 {
							k = key.AppendTag(k, limits[i].tag, strconv.FormatInt(x%int64(limits[i].values), 10))
						}
						ops[i] = store.Op{Key: k, Params: &params[i], Cost: 1}
					}
					if _, err := st.Apply(ctx, batch, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric((redisCPU(b, srv)-cpu0)*1e6/float64(b.N), "redis-µs/req")
			if calls, batches := st.CoalesceStats(); calls > calls0 {
				b.ReportMetric(float64(batches-batches0)/float64(calls-calls0), "reqs/call")
			}
		})
	}
}

// redisCPU is the seconds of CPU the server has used, user and system.
func redisCPU(b *testing.B, srv *redistest.Server) float64 {
	b.Helper()
	info, err := srv.Do("INFO", "cpu")
	if err != nil {
		b.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(info, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}
