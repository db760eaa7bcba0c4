package algorithm

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// local reads a wall-clock time of zone, for the tables below.
func local(t *testing.T, zone, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func mustCalendar(t testing.TB, unit CalendarUnit, zone string) *Calendar {
	t.Helper()
	c, err := NewCalendar(unit, zone)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCalendarWindows checks the window of an instant against the calendar: DST changes (a
// day of 23 and 25 hours), a month's end, a leap day, zones 30 and 45 minutes off the hour.
func TestCalendarWindows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		zone       string
		unit       CalendarUnit
		at         string // local wall clock
		start, end string // local wall clock
		hours      float64
	}{
		{"berlin spring forward day", "Europe/Berlin", CalendarDay, "2026-03-29 12:00", "2026-03-29 00:00", "2026-03-30 00:00", 23},
		{"berlin spring forward, before the change", "Europe/Berlin", CalendarDay, "2026-03-29 01:30", "2026-03-29 00:00", "2026-03-30 00:00", 23},
		{"berlin fall back day", "Europe/Berlin", CalendarDay, "2026-10-25 23:59", "2026-10-25 00:00", "2026-10-26 00:00", 25},
		{"berlin plain day", "Europe/Berlin", CalendarDay, "2026-07-01 00:00", "2026-07-01 00:00", "2026-07-02 00:00", 24},
		{"berlin week across fall back", "Europe/Berlin", CalendarWeek, "2026-10-25 10:00", "2026-10-19 00:00", "2026-10-26 00:00", 7*24 + 1},
		{"week starts monday", "UTC", CalendarWeek, "2026-11-30 00:00", "2026-11-30 00:00", "2026-12-07 00:00", 7 * 24},
		{"week sunday night", "UTC", CalendarWeek, "2026-11-29 23:59", "2026-11-23 00:00", "2026-11-30 00:00", 7 * 24},
		{"month end", "UTC", CalendarMonth, "2026-01-31 23:59", "2026-01-01 00:00", "2026-02-01 00:00", 31 * 24},
		{"february, common year", "UTC", CalendarMonth, "2026-02-15 08:00", "2026-02-01 00:00", "2026-03-01 00:00", 28 * 24},
		{"leap day, day window", "UTC", CalendarDay, "2028-02-29 18:00", "2028-02-29 00:00", "2028-03-01 00:00", 24},
		{"leap day, month window", "Europe/Berlin", CalendarMonth, "2028-02-29 23:59", "2028-02-01 00:00", "2028-03-01 00:00", 29 * 24},
		{"leap year", "UTC", CalendarYear, "2028-12-31 23:59", "2028-01-01 00:00", "2029-01-01 00:00", 366 * 24},
		{"year, new year's midnight", "Europe/Berlin", CalendarYear, "2027-01-01 00:00", "2027-01-01 00:00", "2028-01-01 00:00", 365 * 24},
		{"kolkata +5:30 day", "Asia/Kolkata", CalendarDay, "2026-06-01 05:29", "2026-06-01 00:00", "2026-06-02 00:00", 24},
		{"kathmandu +5:45 week", "Asia/Kathmandu", CalendarWeek, "2026-06-07 23:59", "2026-06-01 00:00", "2026-06-08 00:00", 7 * 24},
		{"adelaide +9:30/+10:30 month with DST end", "Australia/Adelaide", CalendarMonth, "2026-04-05 02:30", "2026-04-01 00:00", "2026-05-01 00:00", 30*24 + 1},
		{"adelaide DST start day", "Australia/Adelaide", CalendarDay, "2026-10-04 03:00", "2026-10-04 00:00", "2026-10-05 00:00", 23},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := mustCalendar(t, tc.unit, tc.zone)
			at := local(t, tc.zone, tc.at).UnixMicro()
			start, end := c.Window(at)
			if want := local(t, tc.zone, tc.start).UnixMicro(); start != want {
				t.Errorf("start %s, want %s", time.UnixMicro(start).In(c.loc), time.UnixMicro(want).In(c.loc))
			}
			if want := local(t, tc.zone, tc.end).UnixMicro(); end != want {
				t.Errorf("end %s, want %s", time.UnixMicro(end).In(c.loc), time.UnixMicro(want).In(c.loc))
			}
			if got := time.Duration(end-start) * time.Microsecond; got != time.Duration(tc.hours*float64(time.Hour)) {
				t.Errorf("window of %s, want %vh", got, tc.hours)
			}
		})
	}
}

// TestCalendarPartition checks, at random instants over decades and in zones whose DST changes
// skip or repeat local midnight (Sao Paulo until 2019, Beirut, Havana, Santiago) or skipped a
// whole day (Apia, December 2011), that a window holds its instant and the windows meet end to
// end: every instant of a window finds that same window, so the memory store and the bounds the
// Redis scripts get agree.
func TestCalendarPartition(t *testing.T) {
	t.Parallel()
	zones := []string{"UTC", "Europe/Berlin", "America/Sao_Paulo", "Asia/Beirut", "America/Havana",
		"America/Santiago", "Pacific/Apia", "Australia/Lord_Howe", "Asia/Kathmandu", "America/St_Johns"}
	rng := rand.New(rand.NewPCG(7, 8))
	lo, hi := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for _, zone := range zones {
		for unit := CalendarDay; unit <= CalendarYear; unit++ {
			c := mustCalendar(t, unit, zone)
			check := func(now int64) {
				start, end := c.window(now)
				if !(start <= now && now < end) {
					t.Fatalf("%s %s: window [%d, %d) does not hold %d (%s)", zone, unit, start, end, now, time.UnixMicro(now).In(c.loc))
				}
				for _, inside := range []int64{start, end - 1, start + rng.Int64N(end-start)} {
					if s, e := c.window(inside); s != start || e != end {
						t.Fatalf("%s %s: %s is in [%s, %s) but finds [%s, %s)", zone, unit, time.UnixMicro(inside).In(c.loc),
							time.UnixMicro(start).In(c.loc), time.UnixMicro(end).In(c.loc), time.UnixMicro(s).In(c.loc), time.UnixMicro(e).In(c.loc))
					}
				}
				if s, _ := c.window(end); s != end {
					t.Fatalf("%s %s: the window after [%d, %d) starts at %d", zone, unit, start, end, s)
				}
				if hours := (end - start) / 3_600_000_000; hours < 22 || hours > 367*24 {
					t.Fatalf("%s %s: window of %d hours", zone, unit, hours)
				}
			}
			for range 300 {
				check(lo + rng.Int64N(hi-lo))
			}
			// Every DST change of the zone between 2010 and 2020, and just before it.
			for t0 := time.Date(2010, 1, 1, 0, 0, 0, 0, c.loc); t0.Year() < 2020; {
				_, next := t0.ZoneBounds()
				if next.IsZero() {
					break
				}
				check(next.UnixMicro())
				check(next.UnixMicro() - 1)
				t0 = next
			}
		}
	}
}

// TestCalendarFixedWindow decides a calendar-aligned fixed_window across a DST change: the
// count resets at local midnight, reset_after and retry_after count to it, and the state
// expires at it.
func TestCalendarFixedWindow(t *testing.T) {
	t.Parallel()
	c := mustCalendar(t, CalendarDay, "Europe/Berlin")
	base, err := NewParams(FixedWindow, 2, 0, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, err := base.WithCalendar(c)
	if err != nil {
		t.Fatal(err)
	}
	midnight := local(t, "Europe/Berlin", "2026-10-26 00:00").UnixMicro() // after a 25-hour day
	var s State
	for i, tc := range []struct {
		at           int64
		cost         int64
		allowed      bool
		remaining    int64
		reset, retry int64
	}{
		{midnight - 25*3600e6, 1, true, 1, 25 * 3600e6, 0}, // the day's first instant
		{midnight - 3600e6, 1, true, 0, 3600e6, 0},
		{midnight - 1, 1, false, 0, 1, 1},
		{midnight, 2, true, 0, 24 * 3600e6, 0}, // a new day starts at 0
		{midnight + 1, 1, false, 0, 24*3600e6 - 1, 24*3600e6 - 1},
	} {
		r := Decide(&p, &s, tc.at, tc.cost)
		if r.Allowed != tc.allowed || r.Remaining != tc.remaining || r.ResetAfter != tc.reset || r.RetryAfter != tc.retry {
			t.Fatalf("request %d: %+v, want allowed %v remaining %d reset %d retry %d", i, r, tc.allowed, tc.remaining, tc.reset, tc.retry)
		}
		if r.Allowed {
			if idle := Commit(&p, &s, tc.at, tc.cost); idle != tc.at+r.ResetAfter {
				t.Fatalf("request %d: idle at %d, want the window's end %d", i, idle, tc.at+r.ResetAfter)
			}
		}
	}
	if p.Period != (24*time.Hour).Microseconds() || p.Calendar() != c {
		t.Fatalf("period %d, calendar %v", p.Period, p.Calendar())
	}
}

func TestCalendarErrors(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"Mars/Olympus_Mons", "", "Local", "../../etc/passwd"} {
		if _, err := NewCalendar(CalendarDay, zone); !errors.Is(err, ErrParams) {
			t.Errorf("zone %q: %v, want ErrParams", zone, err)
		}
	}
	if _, err := NewCalendar(0, "UTC"); !errors.Is(err, ErrParams) {
		t.Errorf("unit 0: %v", err)
	}
	c := mustCalendar(t, CalendarDay, "UTC")
	for _, k := range Kinds {
		p, err := NewParams(k, 10, 0, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.WithCalendar(c)
		if (err == nil) != (k == FixedWindow) {
			t.Errorf("%s with a calendar: %v", k, err)
		}
	}
}

// TestCalendarBoundsTable checks the table the Redis store sends: three windows end to end
// around now, the same pointer while now stays in its window.
func TestCalendarBoundsTable(t *testing.T) {
	t.Parallel()
	c := mustCalendar(t, CalendarMonth, "Asia/Kolkata")
	now := local(t, "Asia/Kolkata", "2028-02-29 12:00").UnixMicro()
	b := c.Bounds(now)
	want := []string{"2028-01-01 00:00", "2028-02-01 00:00", "2028-03-01 00:00", "2028-04-01 00:00"}
	for i, w := range want {
		if b.B[i] != local(t, "Asia/Kolkata", w).UnixMicro() {
			t.Errorf("bound %d: %s, want %s", i, time.UnixMicro(b.B[i]).In(c.loc), w)
		}
	}
	if c.Bounds(b.B[2]-1) != b || c.Bounds(b.B[1]) != b {
		t.Error("the table was computed again within its window")
	}
	if s, e, ok := b.Window(b.B[0]); !ok || s != b.B[0] || e != b.B[1] {
		t.Errorf("previous window: %d %d %v", s, e, ok)
	}
	if _, _, ok := b.Window(b.B[3]); ok {
		t.Error("a table holds an instant past its last window")
	}
}
