package algorithm

import (
	"fmt"
	"sync/atomic"
	"time"
)

// CalendarUnit is the length of a calendar window: a day, a week, a month or a year of a time
// zone's calendar.
type CalendarUnit uint8

// The calendar units (docs/architecture.md, Calendar windows).
const (
	CalendarDay   CalendarUnit = iota + 1 // local midnight to local midnight
	CalendarWeek                          // Monday 00:00 to Monday 00:00
	CalendarMonth                         // the 1st of a month to the 1st of the next
	CalendarYear                          // 1 January to 1 January
)

// Nominal is the length a unit is reported as (a period for headers and fingerprints); its
// windows are as long as the calendar makes them: a day of 23 or 25 hours across a DST change,
// a month of 28 to 31 days.
func (u CalendarUnit) Nominal() time.Duration {
	switch u {
	case CalendarWeek:
		return 7 * 24 * time.Hour
	case CalendarMonth:
		return 30 * 24 * time.Hour
	case CalendarYear:
		return 365 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// String returns the period as a policy writes it: 1d, 1w, 1mo or 1y.
func (u CalendarUnit) String() string {
	switch u {
	case CalendarDay:
		return "1d"
	case CalendarWeek:
		return "1w"
	case CalendarMonth:
		return "1mo"
	case CalendarYear:
		return "1y"
	}
	return fmt.Sprintf("calendar(%d)", uint8(u))
}

// Calendar aligns a fixed_window to a time zone's calendar rather than to the Unix epoch. Its
// windows are computed from the zone's rules (time.Location), so a day is 23 or 25 hours long
// across a DST change. Build one with NewCalendar; it is safe for concurrent use and meant to
// be shared by every Params of a rule, which keeps its cache of the current window warm.
type Calendar struct {
	unit CalendarUnit
	loc  *time.Location
	// bounds caches the windows around the last instant asked for. A pointer swapped whole,
	// so a reader never sees half of two tables; the Redis store sends the table to its
	// scripts and uses the pointer to tell tables apart.
	bounds atomic.Pointer[CalendarBounds]
}

// CalendarBounds are four consecutive window boundaries (µs since the epoch): the previous
// window [B[0], B[1]), the current one [B[1], B[2]) and the next [B[2], B[3]). The Redis
// scripts pick from them the window that holds Redis TIME, so a node's clock may be off by a
// whole window either way and the decision is still the one the memory store makes.
type CalendarBounds struct {
	B [4]int64
}

// Window returns the window of b that holds now, and false when none does.
func (b *CalendarBounds) Window(now int64) (start, end int64, ok bool) {
	for i := range 3 {
		if b.B[i] <= now && now < b.B[i+1] {
			return b.B[i], b.B[i+1], true
		}
	}
	return 0, 0, false
}

// NewCalendar returns the calendar of unit in the IANA zone named zone ("Europe/Berlin",
// "UTC"). An unknown zone is an error.
func NewCalendar(unit CalendarUnit, zone string) (*Calendar, error) {
	if unit < CalendarDay || unit > CalendarYear {
		return nil, fmt.Errorf("%w: unknown calendar unit %d", ErrParams, unit)
	}
	if zone == "" || zone == "Local" {
		// "" and "Local" are the process's zone to time.LoadLocation: not one every node agrees on.
		return nil, fmt.Errorf("%w: calendar zone %q: want an IANA name such as Europe/Berlin or UTC", ErrParams, zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("%w: calendar zone %q: %v", ErrParams, zone, err)
	}
	return &Calendar{unit: unit, loc: loc}, nil
}

// Unit returns c's unit.
func (c *Calendar) Unit() CalendarUnit { return c.unit }

// Zone returns the name of c's time zone.
func (c *Calendar) Zone() string { return c.loc.String() }

// Window returns the calendar window that holds now (µs): start <= now < end.
func (c *Calendar) Window(now int64) (start, end int64) {
	if b := c.bounds.Load(); b != nil {
		if start, end, ok := b.Window(now); ok {
			return start, end
		}
	}
	b := c.Bounds(now)
	return b.B[1], b.B[2]
}

// Bounds returns the previous, current and next windows around now (see CalendarBounds). The
// table is computed once per window and shared: callers must not change it.
func (c *Calendar) Bounds(now int64) *CalendarBounds {
	if b := c.bounds.Load(); b != nil && b.B[1] <= now && now < b.B[2] {
		return b
	}
	b := &CalendarBounds{}
	b.B[1], b.B[2] = c.window(now)
	b.B[0], _ = c.window(b.B[1] - 1)
	_, b.B[3] = c.window(b.B[2])
	c.bounds.Store(b)
	return b
}

// window computes the window that holds now from the zone's rules. The window of an instant is
// the one of its local date; its start is the first instant of that date (or of the week's
// Monday, the month's 1st, the year's 1 January). Where a DST change skips or repeats local
// midnight, the first instant is the change itself, and the loops below keep start <= now <
// end and make the windows meet end to end, so any instant of a window finds the same window.
func (c *Calendar) window(now int64) (start, end int64) {
	t := time.UnixMicro(now).In(c.loc)
	y, m, d := t.Date()
	switch c.unit {
	case CalendarWeek:
		// Back to Monday, normalized (the 0th of a month is the last of the one before).
		y, m, d = time.Date(y, m, d-(int(t.Weekday())+6)%7, 12, 0, 0, 0, time.UTC).Date()
	case CalendarMonth:
		d = 1
	case CalendarYear:
		m, d = time.January, 1
	}
	start = c.first(y, m, d)
	ny, nm, nd := c.step(y, m, d, 1)
	end = c.first(ny, nm, nd)
	for range 4 {
		if start <= now {
			break
		}
		y, m, d = c.step(y, m, d, -1)
		start, end = c.first(y, m, d), start
	}
	for range 4 {
		if now < end {
			break
		}
		y, m, d = ny, nm, nd
		ny, nm, nd = c.step(y, m, d, 1)
		start, end = end, c.first(ny, nm, nd)
	}
	return start, end
}

// step moves the date (y, m, d), which starts a window, n windows on.
func (c *Calendar) step(y int, m time.Month, d, n int) (int, time.Month, int) {
	var t time.Time
	switch c.unit {
	case CalendarDay:
		t = time.Date(y, m, d+n, 12, 0, 0, 0, time.UTC)
	case CalendarWeek:
		t = time.Date(y, m, d+7*n, 12, 0, 0, 0, time.UTC)
	case CalendarMonth:
		t = time.Date(y, m+time.Month(n), d, 12, 0, 0, 0, time.UTC)
	default:
		t = time.Date(y+n, m, d, 12, 0, 0, 0, time.UTC)
	}
	return t.Date()
}

// first returns the first instant (µs) whose local date in c's zone is (y, m, d) or later: local
// midnight, or the DST change when the change skips midnight (time.Date may then answer an
// instant of the day before).
func (c *Calendar) first(y int, m time.Month, d int) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	if ly, lm, ld := t.Date(); ly != y || lm != m || ld != d {
		if _, zoneEnd := t.ZoneBounds(); !zoneEnd.IsZero() {
			t = zoneEnd
		}
	}
	return t.UnixMicro()
}
