package algorithm

import (
	"math"
	"testing"
	"time"
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
		{"zero or negative ttl holds nothing", []step{
			{"acquire", "a", 0, 0, true, 0},
			{"acquire", "b", 0, -5, true, 0},
		}},
		{"renew to zero ttl frees the slot", []step{
			{"acquire", "a", 0, 100, true, 1},
			{"renew", "a", 10, 0, true, 0},
		}},
	}
	p, err := NewParams(Concurrency, limit, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s State
			for i, st := range tt.steps {
				var ok bool
				switch st.op {
				case "acquire":
					if ok = Decide(&p, &s, st.now, 1).Allowed; ok {
						TakeSlot(&s, st.now, st.id, st.ttl)
					}
				case "renew":
					_, ok = SettleSlot(&s, st.now, st.id, st.ttl)
				case "release":
					_, ok = SettleSlot(&s, st.now, st.id, 0)
				case "count":
					ok = true
				}
				if ok != st.wantOK {
					t.Fatalf("step %d %s %q: ok = %v, want %v", i, st.op, st.id, ok, st.wantOK)
				}
				if got := InFlight(&s, st.now); got != st.wantNum {
					t.Fatalf("step %d %s %q: in flight = %d, want %d", i, st.op, st.id, got, st.wantNum)
				}
			}
		})
	}
}

// TestSlotResults checks what a concurrency limit reports: what is left, when the first slot
// returns by itself, when all have, and a limit of 0.
func TestSlotResults(t *testing.T) {
	p, err := NewParams(Concurrency, 2, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var s State
	if r := Decide(&p, &s, 0, 0); !r.Allowed || r.Remaining != 2 || r.ResetAfter != 0 || r.RetryAfter != 0 {
		t.Fatalf("fresh look = %+v", r)
	}
	if r := Decide(&p, &s, 0, 1); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("first = %+v", r)
	}
	TakeSlot(&s, 0, "a", 100)
	TakeSlot(&s, 10, "b", 300)
	if r := Decide(&p, &s, 20, 5); r.Allowed || r.Remaining != 0 || r.RetryAfter != 80 || r.ResetAfter != 290 || r.Reason != ReasonNone {
		t.Fatalf("full = %+v, want denied, retry 80, reset 290 (a cost of 5 asks one slot)", r)
	}
	if r := Decide(&p, &s, 20, 0); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("look when full = %+v", r)
	}
	if r := Decide(&p, &s, 100, 1); !r.Allowed || r.Remaining != 0 || r.ResetAfter != 210 {
		t.Fatalf("after a's expiry = %+v", r)
	}
	zero, err := NewParams(Concurrency, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := Decide(&zero, &State{}, 0, 1); r.Allowed || r.Reason != ReasonCostExceedsCapacity {
		t.Fatalf("limit 0 = %+v", r)
	}
	if _, err := NewParams(Concurrency, 2, 0, time.Second); err == nil {
		t.Fatal("a concurrency period was taken")
	}
	if k, err := ParseKind("concurrency"); err != nil || k != Concurrency {
		t.Fatalf("ParseKind = %v, %v", k, err)
	}
	if _, err := p.WithDrain(); err == nil {
		t.Fatal("drain on a concurrency limit was taken")
	}
}

// TestSlotUndo checks that an Undo saved before TakeSlot gives the slot back, as a batch whose
// sibling denies needs.
func TestSlotUndo(t *testing.T) {
	p, err := NewParams(Concurrency, 3, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var s State
	Decide(&p, &s, 0, 1)
	TakeSlot(&s, 0, "a", 100)
	var u Undo
	Decide(&p, &s, 1, 1)
	u.Save(&s)
	TakeSlot(&s, 1, "b", 100)
	u.Restore(&s)
	if n := InFlight(&s, 2); n != 1 || s.Log.Slots[0].ID != "a" {
		t.Fatalf("after undo: %d in flight, %+v", n, s.Log.Slots)
	}
}

func BenchmarkSlotsAcquireRelease(b *testing.B) {
	p, err := NewParams(Concurrency, 16, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	var s State
	for i := 0; i < 8; i++ {
		TakeSlot(&s, 0, string(rune('a'+i)), 1e9)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if !Decide(&p, &s, 1, 1).Allowed {
			b.Fatal("refused")
		}
		TakeSlot(&s, 1, "x", 1e9)
		if _, held := SettleSlot(&s, 1, "x", 0); !held {
			b.Fatal("not held")
		}
	}
}
