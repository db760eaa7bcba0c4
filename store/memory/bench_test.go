package memory

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// BenchmarkMemoryPerKey fills the store with 1M token-bucket keys shaped like real ones
// (sl:<rule>:<version>:{u=<user>}:<tenant>:<user>, about 40 bytes) and reports the heap each
// key costs. Run it with -benchtime 1x: the figure is per key, not per op.
func BenchmarkMemoryPerKey(b *testing.B) {
	const keys = 1_000_000
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 100, 0, time.Minute)
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := New(WithSweepInterval(0))
		res := make([]algorithm.Result, 1)
		k := []byte("sl:per-user:1a2b3c4d:{u=")
		for i := range keys {
			u := strconv.Itoa(1_000_000 + i)
			key := append(append(append(k[:len(k):len(k)], u...), "}:acme:"...), u...)
			s.Apply(context.Background(), &store.Batch{Ops: []store.Op{{Key: key, Params: &p, Cost: 1}}}, res)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "bytes/key")
		runtime.KeepAlive(s)
	}
}

// BenchmarkApply is the store's share of a Check: one token-bucket op on a warm key, with the
// store's own clock and with a fixed one, to tell the clock's cost apart.
func BenchmarkApply(b *testing.B) {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000_000, 0, time.Second)
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"clock", nil},
		{"fixed-clock", []Option{WithClock(func() int64 { return 1_700_000_000_000_000 })}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := New(append(c.opts, WithSweepInterval(0))...)
			batch := store.Batch{Ops: []store.Op{{Key: []byte("sl:per-user:1a2b3c4d:{u=u1}:acme:u1"), Params: &p, Cost: 1}}}
			res := make([]algorithm.Result, 1)
			b.ReportAllocs()
			for b.Loop() {
				s.Apply(context.Background(), &batch, res)
			}
		})
	}
}

// BenchmarkNewKey is the cost of a key's first checks in a store already holding 100K keys:
// each new key is checked three times, the way a new client's first requests arrive. A
// stripe's table is rebuilt as it fills; the rebuilds must stay amortised.
func BenchmarkNewKey(b *testing.B) {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 100, 0, time.Minute)
	s := New(WithSweepInterval(0))
	res := make([]algorithm.Result, 1)
	check := func(k []byte) {
		s.Apply(context.Background(), &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res)
	}
	for i := range 100_000 {
		check([]byte("sl:warm:" + strconv.Itoa(i)))
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		k := []byte("sl:new:" + strconv.Itoa(i))
		check(k)
		check(k)
		check(k)
		i++
	}
}

// BenchmarkCounter is one request of a sliding_window_counter limit of 100 per 2 s on 1,000
// keys, each asked at 3x its limit, alone and beside a global one (a batch, whose Undo the
// counter's buckets must support) that allows all or that is full and denies all: the memory
// store's CPU per request with the buckets at their usual ~20 (run the same benchmark on the
// earlier version for the two-window state).
func BenchmarkCounter(b *testing.B) {
	p, _ := algorithm.NewParams(algorithm.SlidingWindowCounter, 100, 0, 2*time.Second)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("sl:swc:1:{u=" + strconv.Itoa(i) + "}")
	}
	wide, _ := algorithm.NewParams(algorithm.SlidingWindowCounter, 1_000_000_000, 0, 2*time.Second)
	for _, c := range []struct {
		name   string
		n      int
		global *algorithm.Params
	}{{"1limits", 1, nil}, {"2limits-global-full", 2, &p}, {"2limits", 2, &wide}} {
		n := c.n
		b.Run(c.name, func(b *testing.B) {
			now := int64(1_700_000_000_000_000)
			s := New(WithClock(func() int64 { return now }), WithSweepInterval(0))
			ops := make([]store.Op, n)
			for j := range ops {
				ops[j] = store.Op{Params: &p, Cost: 1}
			}
			if n > 1 {
				ops[1].Params = c.global
			}
			global := []byte("sl:swc-global:1")
			batch := store.Batch{Ops: ops}
			res := make([]algorithm.Result, n)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now += 20 / 3
				ops[0].Key = keys[i%len(keys)]
				if n > 1 {
					ops[1].Key = global
				}
				i++
				s.Apply(context.Background(), &batch, res)
			}
		})
	}
}
