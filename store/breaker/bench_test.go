package breaker

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// BenchmarkApply is a check's store call as the server makes it: through the guard, with its
// deadline, to a real Redis, from parallel callers.
func BenchmarkApply(b *testing.B) {
	srv := redistest.Start(b)
	inner, err := redis.New(ctx, "redis://"+srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	s := New(inner, Options{Timeout: time.Second})
	defer s.Close()
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000_000, 0, time.Second)
	for _, n := range []int{1, 4} {
		// x1: one caller per CPU, each waiting on its round trip; x16: sixteen per CPU, as
		// a loaded server pipelines them.
		for _, par := range []int{1, 16} {
			b.Run(fmt.Sprintf("%dlimits/x%d", n, par), func(b *testing.B) {
				var next atomic.Int64
				b.ReportAllocs()
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					user := strconv.FormatInt(next.Add(1), 10)
					batch := &store.Batch{}
					for i := range n {
						k := key.AppendTag(key.AppendHead(nil, "rule"+strconv.Itoa(i), "1"), 'u', user)
						batch.Ops = append(batch.Ops, store.Op{Key: k, Params: &p, Cost: 1})
					}
					res := make([]algorithm.Result, n)
					for pb.Next() {
						if _, err := s.Apply(ctx, batch, res); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
