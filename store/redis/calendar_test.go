package redis

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// calendarLimits are fixed windows aligned to calendars: days across DST changes, a week in a
// +5:30 zone, months in a zone with a 30-minute offset and DST, a year in a +5:45 zone.
func calendarLimits(t testing.TB) []limit {
	t.Helper()
	var ls []limit
	for i, spec := range []struct {
		unit algorithm.CalendarUnit
		zone string
		n    int64
	}{
		{algorithm.CalendarDay, "Europe/Berlin", 5},
		{algorithm.CalendarDay, "Australia/Adelaide", 3},
		{algorithm.CalendarWeek, "Asia/Kolkata", 8},
		{algorithm.CalendarMonth, "Australia/Adelaide", 6},
		{algorithm.CalendarMonth, "UTC", 4},
		{algorithm.CalendarYear, "Asia/Kathmandu", 9},
	} {
		cal, err := algorithm.NewCalendar(spec.unit, spec.zone)
		if err != nil {
			t.Fatal(err)
		}
		base, err := algorithm.NewParams(algorithm.FixedWindow, spec.n, 0, spec.unit.Nominal())
		if err != nil {
			t.Fatal(err)
		}
		p, err := base.WithCalendar(cal)
		if err != nil {
			t.Fatal(err)
		}
		k := key.AppendHead(nil, fmt.Sprintf("cal%d", i), "v1")
		counter := key.AppendHead(nil, fmt.Sprintf("cal%d", i), "!burst")
		if i%2 == 0 {
			k = key.AppendTag(k, 'u', "ann")
			counter = key.AppendTag(counter, 'u', "ann")
		}
		ls = append(ls, limit{key: k, params: p, counter: counter})
	}
	return ls
}

// calendarDifferential sends random traffic through the memory store and st from start on,
// jumping often to just before or at a window's end, and requires identical results.
func calendarDifferential(t *testing.T, st *Store, c *clock, start time.Time, steps int, seed uint64) {
	t.Helper()
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	c.us.Store(start.UnixMicro())
	rng := rand.New(rand.NewPCG(seed, 2))
	ls := calendarLimits(t)
	rolled := 0
	for step := range steps {
		switch rng.IntN(10) {
		case 0, 1: // to just before or at a window's end
			p := &ls[rng.IntN(len(ls))].params
			_, end := p.Calendar().Window(c.Now())
			c.us.Store(end - rng.Int64N(2))
		case 2:
			c.us.Add(rng.Int64N(30 * 3600e6))
		default:
			c.us.Add(rng.Int64N(600e6))
		}
		var b store.Batch
		for range 1 + rng.IntN(3) {
			l := &ls[rng.IntN(len(ls))]
			b.Ops = append(b.Ops, store.Op{Key: l.key, Params: &l.params, Cost: rng.Int64N(4), Shadow: rng.IntN(8) == 0})
		}
		want := make([]algorithm.Result, len(b.Ops))
		got := make([]algorithm.Result, len(b.Ops))
		if _, err := mem.Apply(ctx, &b, want); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Apply(ctx, &b, got); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range want {
			if got[i] != want[i] {
				cal := b.Ops[i].Params.Calendar()
				t.Fatalf("step %d op %d (%s %s, %s):\n redis  %+v\n memory %+v", step, i, cal.Unit(), cal.Zone(),
					time.UnixMicro(c.Now()).In(time.UTC), got[i], want[i])
			}
			if got[i].Allowed && got[i].Remaining == b.Ops[i].Params.Limit-b.Ops[i].Cost && b.Ops[i].Cost > 0 {
				rolled++ // a fresh window's first request
			}
		}
	}
	if rolled < 10 {
		t.Fatalf("only %d fresh windows seen: the traffic did not cross boundaries", rolled)
	}
}

// TestCalendarSameDecisionsAsMemory runs calendar windows through Redis and the memory store
// across DST changes (Berlin in March and October 2027, Adelaide in April and October 2027), a
// month's end and the leap day of 2028, with the node's clock right, a day behind and a day
// ahead of the time Redis decides on; and a node clock further off fails rather than decides
// in a wrong window.
func TestCalendarSameDecisionsAsMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		start string
		skew  time.Duration
	}{
		{"dst spring 2027", "2027-03-27T12:00:00Z", 0},
		{"dst autumn 2027", "2027-10-02T00:00:00Z", 0},
		{"leap day 2028", "2028-02-27T00:00:00Z", 0},
		{"node a day behind", "2027-03-27T12:00:00Z", -22 * time.Hour},
		{"node a day ahead", "2028-02-27T00:00:00Z", 22 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			st := connect(t, "redis://"+srv.Addr, c)
			if tc.skew != 0 {
				st.calClock = func() int64 { return c.Now() + tc.skew.Microseconds() }
			}
			start, err := time.Parse(time.RFC3339, tc.start)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Reset(ctx, keysOf(calendarLimits(t))); err != nil {
				t.Fatal(err)
			}
			calendarDifferential(t, st, c, start, 600, uint64(len(tc.name)))
		})
	}
	t.Run("node clock too far off", func(t *testing.T) {
		c := newClock()
		st := connect(t, "redis://"+srv.Addr, c)
		st.calClock = func() int64 { return c.Now() + (72 * time.Hour).Microseconds() }
		ls := calendarLimits(t)
		res := make([]algorithm.Result, 1)
		_, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: ls[0].key, Params: &ls[0].params, Cost: 1}}}, res)
		if err == nil || !strings.Contains(err.Error(), "calendar window bounds") {
			t.Fatalf("a node 3 days off Redis decided a day window: %v %+v", err, res[0])
		}
	})
}

// drainLimits drain on deny: a bucket of each encoding, a fixed window (one on a calendar) and
// a log.
func drainLimits(t testing.TB) []limit {
	t.Helper()
	var ls []limit
	cal, err := algorithm.NewCalendar(algorithm.CalendarDay, "Asia/Kathmandu")
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range []algorithm.Kind{algorithm.TokenBucket, algorithm.GCRA, algorithm.LeakyBucket, algorithm.FixedWindow, algorithm.FixedWindow, algorithm.SlidingWindowLog} {
		period := 300 * time.Millisecond
		if i == 4 {
			period = 24 * time.Hour
		}
		p, err := algorithm.NewParams(kind, 6, 9, period)
		if err == nil && i == 4 {
			p, err = p.WithCalendar(cal)
		}
		if err == nil {
			p, err = p.WithDrain()
		}
		if err != nil {
			t.Fatal(err)
		}
		k := key.AppendHead(nil, fmt.Sprintf("drain%d", i), "v1")
		counter := key.AppendHead(nil, fmt.Sprintf("drain%d", i), "!burst")
		if i%2 == 1 {
			k = key.AppendTag(k, 'u', fmt.Sprint("user", i%3))
			counter = key.AppendTag(counter, 'u', fmt.Sprint("user", i%3))
		}
		ls = append(ls, limit{key: k, params: p, counter: counter})
	}
	return ls
}

func keysOf(ls []limit) [][]byte {
	keys := make([][]byte, len(ls))
	for i := range ls {
		keys[i] = ls[i].key
	}
	return keys
}
