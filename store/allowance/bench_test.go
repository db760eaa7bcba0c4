package allowance

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkApply measures a request of 1 and of 4 limits through a node with allowances over
// the memory store: most are decided from held units, one in a grant's worth by the store.
// Against BenchmarkBare, the same requests to the store alone.
func BenchmarkApply(b *testing.B) {
	for _, limits := range []int{1, 4} {
		b.Run(strconv.Itoa(limits), func(b *testing.B) {
			n, err := New(memory.New(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			benchApply(b, n, limits)
		})
	}
}

// BenchmarkBare is BenchmarkApply's requests to the memory store alone.
func BenchmarkBare(b *testing.B) {
	for _, limits := range []int{1, 4} {
		b.Run(strconv.Itoa(limits), func(b *testing.B) { benchApply(b, memory.New(), limits) })
	}
}

func benchApply(b *testing.B, st store.Store, limits int) {
	p := params(b, algorithm.FixedWindow, 1<<40, 24*time.Hour)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ops := make([]store.Op, limits)
		for i := range ops {
			ops[i] = store.Op{Key: []byte("key-" + strconv.Itoa(i)), Params: p, Cost: 1}
		}
		res := make([]algorithm.Result, limits)
		batch := &store.Batch{Ops: ops}
		for pb.Next() {
			if _, err := st.Apply(ctx, batch, res); err != nil || !res[0].Allowed {
				b.Fatal(err, res[0])
			}
		}
	})
}

// BenchmarkSweep measures one sweep over 10,000 keys that each hold units and were used
// recently: the sweep's cost when nothing is idle yet, which a node pays every Idle/4.
func BenchmarkSweep(b *testing.B) {
	c := newClock()
	n := node(b, sharedMemory(c), c)
	p := params(b, algorithm.FixedWindow, 1<<20, time.Hour)
	for i := range 10_000 {
		apply(b, n, store.Op{Key: []byte("key-" + strconv.Itoa(i)), Params: p, Cost: 1})
	}
	b.ResetTimer()
	for range b.N {
		n.sweep(ctx)
	}
}
