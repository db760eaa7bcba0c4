package algorithm

import (
	"testing"
	"time"
)

// BenchmarkDecideCommit measures one allowed request through each algorithm: the pure state
// transition with no store around it.
func BenchmarkDecideCommit(b *testing.B) {
	for _, k := range Kinds {
		b.Run(k.String(), func(b *testing.B) {
			p := mustParams(b, k, 1_000_000_000, 0, time.Second)
			var s State
			now := base
			b.ReportAllocs()
			for b.Loop() {
				now += 1000
				if r := Decide(&p, &s, now, 1); r.Allowed {
					Commit(&p, &s, now, 1)
				}
			}
		})
	}
}

// BenchmarkTake is BenchmarkDecideCommit through Take, the fused path a store uses for a
// request with one limit.
func BenchmarkTake(b *testing.B) {
	for _, k := range Kinds {
		b.Run(k.String(), func(b *testing.B) {
			p := mustParams(b, k, 1_000_000_000, 0, time.Second)
			var s State
			now := base
			b.ReportAllocs()
			var r Result
			for b.Loop() {
				now += 1000
				Take(&p, &s, now, 1, &r)
			}
		})
	}
}

// BenchmarkCalendar measures a calendar-aligned fixed_window through Take, which finds its
// window in the calendar's cache, and the window computed from the zone's rules, which
// happens once per window (and for a node's first request in it).
func BenchmarkCalendar(b *testing.B) {
	cal, err := NewCalendar(CalendarDay, "Europe/Berlin")
	if err != nil {
		b.Fatal(err)
	}
	p, err := mustParams(b, FixedWindow, 1_000_000_000, 0, 24*time.Hour).WithCalendar(cal)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("take", func(b *testing.B) {
		var s State
		now := base
		b.ReportAllocs()
		var r Result
		for b.Loop() {
			now += 1000
			Take(&p, &s, now, 1, &r)
		}
	})
	b.Run("compute", func(b *testing.B) {
		now := base
		b.ReportAllocs()
		for b.Loop() {
			now += 3_600_000_000
			cal.window(now)
		}
	})
}
