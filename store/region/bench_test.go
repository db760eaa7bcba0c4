package region

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkGlobalCheck measures a check of a global rule over 100K keys, in parallel, against
// the same rule without regions; with-sync runs the sync's read of every tracked key every
// 100 ms meanwhile (the default pace), the contention a busy node sees.
func BenchmarkGlobalCheck(b *testing.B) {
	const keys = 100_000
	users := make([]sluice.Request, keys)
	for i := range users {
		users[i].User = fmt.Sprintf("user-%06d", i)
	}
	for _, c := range []struct {
		name    string
		regions string
		sync    bool
	}{{"per-region", "", false}, {"global", "regions: global", false}, {"global-with-sync", "regions: global", true}} {
		b.Run(c.name, func(b *testing.B) {
			yml := fmt.Sprintf("rules:\n  - {name: quota, key: [user], algorithm: fixed_window, limit: 1000000000, period: 1h, %s}\n", c.regions)
			snap, err := policy.LoadFiles(map[string][]byte{"p.yaml": []byte(yml)})
			if err != nil {
				b.Fatal(err)
			}
			mem := memory.New(memory.WithSweepInterval(0))
			r, err := New(Config{Name: "a", Peers: map[string]string{"b": "127.0.0.1:1"}}, mem, mem, func() *policy.Snapshot { return snap })
			if err != nil {
				b.Fatal(err)
			}
			lim, err := sluice.New(r, snap)
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close()
			ctx := context.Background()
			var d sluice.Decision
			for i := range users {
				if err := lim.Check(ctx, &users[i], &d); err != nil {
					b.Fatal(err)
				}
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				if !c.sync {
					return
				}
				t := time.NewTicker(100 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						if _, err := r.read(ctx, r.nowMicros()); err != nil {
							b.Error(err)
						}
					}
				}
			}()
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var d sluice.Decision
				i := next.Add(7919)
				for pb.Next() {
					i += 7919
					if err := lim.Check(ctx, &users[i%keys], &d); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			close(stop)
			<-done
		})
	}
}
