package algorithm

import (
	"errors"
	"math"
	"testing"
)

func TestSlots(t *testing.T) {
	type step struct {
		op      string // acquire, renew, release, count
		id      string
		now     int64
		ttl     int64
		wantOK  bool  // acquire: taken; renew/release: no error
		wantNum int64 // in flight after the step
	}
	const limit = 2
	tests := []struct {
		name  string
		steps []step
	}{
		{"fills to the limit then refuses", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"acquire", "b", 0, 100, true, 2},
			{"acquire", "c", 0, 100, false, 2},
		}},
		{"release frees a slot", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"acquire", "b", 0, 100, true, 2},
			{"release", "a", 10, 0, true, 1},
			{"acquire", "c", 10, 100, true, 2},
		}},
		{"expiry returns at ttl, not before", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"acquire", "b", 0, 100, true, 2},
			{"acquire", "c", 99, 100, false, 2},
			{"acquire", "c", 100, 100, true, 1},
		}},
		{"renew extends past the old expiry", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"renew", "a", 50, 100, true, 1},
			{"count", "", 149, 0, true, 1},
			{"count", "", 150, 0, true, 0},
		}},
		{"retried acquire takes no second slot", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"acquire", "a", 5, 100, true, 1},
		}},
		{"unknown, settled and expired leases", []step{
			{"release", "x", 0, 0, false, 0},
			{"renew", "x", 0, 100, false, 0},
			{"acquire", "a", 0, 100, true, 1},
			{"release", "a", 1, 0, true, 0},
			{"release", "a", 2, 0, false, 0},
			{"acquire", "b", 0, 10, true, 1},
			{"renew", "b", 10, 100, false, 0},
		}},
		{"huge ttl saturates instead of wrapping", []step{
			{"acquire", "a", 1000, math.MaxInt64, true, 1},
			{"count", "", math.MaxInt64 - 1, 0, true, 1},
			{"renew", "a", 2000, math.MaxInt64, true, 1},
			{"count", "", math.MaxInt64 - 1, 0, true, 1},
		}},
		{"zero or negative ttl takes nothing", []step{
			{"acquire", "a", 0, 0, false, 0},
			{"acquire", "b", 0, -5, false, 0},
		}},
		{"renew to zero ttl frees the slot", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"renew", "a", 10, 0, true, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Slots
			for i, st := range tt.steps {
				var ok bool
				switch st.op {
				case "acquire":
					ok = s.Acquire(st.id, st.now, st.ttl, limit)
				case "renew":
					err := s.Renew(st.id, st.now, st.ttl)
					if err != nil && !errors.Is(err, ErrNoSlot) {
						t.Fatalf("step %d: %v", i, err)
					}
					ok = err == nil
				case "release":
					err := s.Release(st.id, st.now)
					ok = err == nil
				case "count":
					ok = true
				}
				if ok != st.wantOK {
					t.Fatalf("step %d %s %q: ok = %v, want %v", i, st.op, st.id, ok, st.wantOK)
				}
				if got := s.InFlight(st.now); got != st.wantNum {
					t.Fatalf("step %d %s %q: in flight = %d, want %d", i, st.op, st.id, got, st.wantNum)
				}
			}
		})
	}
}

func BenchmarkSlotsAcquireRelease(b *testing.B) {
	var s Slots
	for i := 0; i < 8; i++ {
		s.Acquire(string(rune('a'+i)), 0, 1e9, 16)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if !s.Acquire("x", 1, 1e9, 16) {
			b.Fatal("refused")
		}
		if err := s.Release("x", 1); err != nil {
			b.Fatal(err)
		}
	}
}
