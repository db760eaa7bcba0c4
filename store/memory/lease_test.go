package memory

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestLeaseRecordsSweep: expired lease records stop counting at their expiry and the sweep
// drops them (settling once is tested on both stores in store/redis).
func TestLeaseRecordsSweep(t *testing.T) {
	t.Parallel()
	now := int64(1_800_000_000_000_000)
	s := New(WithClock(func() int64 { return now }), WithSweepInterval(0))
	defer s.Close()
	ctx := context.Background()
	for i := range 10 {
		if err := s.PutLease(ctx, []byte(fmt.Sprint("l", i)), []byte("rec"), time.Duration(i+1)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	now += 5_500_000
	s.Sweep()
	if got := s.LiveLeases(); got != 5 {
		t.Fatalf("after 5.5s of leases of 1..10s: %d live, want 5", got)
	}
	if n := len(s.leases.m); n != 5 {
		t.Fatalf("the sweep kept %d records, want 5", n)
	}
}

// BenchmarkLeaseMemory reports the heap a live lease record holds in the memory store, with a
// record the size the Limiter writes for a request of two limits.
func BenchmarkLeaseMemory(b *testing.B) {
	const n = 100_000
	rec := make([]byte, 120)
	s := New(WithSweepInterval(0))
	defer s.Close()
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		id := fmt.Sprintf("5:acme:ls_%032x", i)
		s.PutLease(ctx, []byte(id), rec, time.Hour)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/lease")
	for range b.N {
	}
}
