package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// PeriodMonth and PeriodYear are the periods a policy writes "1mo" and "1y": a calendar month
// and year, which have no fixed length, so a rule may use them only with calendar. As values
// they are 30 and 365 days and one nanosecond: no other period a policy can give is off a whole
// microsecond, so they are told apart from "30d" and "365d".
const (
	PeriodMonth = 30*24*time.Hour + 1
	PeriodYear  = 365*24*time.Hour + 1
)

// parsePeriod reads a Duration as a policy writes it: ParseDuration's units, weeks ("1w",
// "2w") and the calendar periods "1mo" and "1y".
func parsePeriod(s string) (time.Duration, error) {
	switch s {
	case "1mo":
		return PeriodMonth, nil
	case "1y":
		return PeriodYear, nil
	}
	if n, ok := strings.CutSuffix(s, "w"); ok && n != "" && !strings.ContainsAny(n, "dhmsuµn") {
		d, err := ParseDuration(n + "d")
		if err != nil || d > algorithm.MaxPeriod/7 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return 7 * d, nil
	}
	return ParseDuration(s)
}

// Calendar is a rule's calendar field: the IANA time zone whose calendar aligns the rule's
// fixed windows ("Europe/Berlin"), "true" for UTC, or empty (or "false") for windows aligned
// to the Unix epoch. YAML writes it as a string or a bool; JSON may too.
type Calendar string

// UnmarshalJSON reads a zone name or a bool.
func (c *Calendar) UnmarshalJSON(b []byte) error {
	var on bool
	if err := json.Unmarshal(b, &on); err == nil {
		*c = Calendar(fmt.Sprint(on))
		return nil
	}
	var zone string
	if err := json.Unmarshal(b, &zone); err != nil {
		return fmt.Errorf("calendar: want a time zone name or true, got %s", b)
	}
	*c = Calendar(zone)
	return nil
}

// Zone returns the time zone c names: "UTC" for true, "" for none.
func (c Calendar) Zone() string {
	switch strings.TrimSpace(string(c)) {
	case "", "false":
		return ""
	case "true":
		return "UTC"
	}
	return string(c)
}

// calendarUnit returns the calendar unit of a calendar rule's period: 1d, 1w (7d), 1mo, 1y.
func calendarUnit(period time.Duration) (algorithm.CalendarUnit, bool) {
	switch period {
	case 24 * time.Hour:
		return algorithm.CalendarDay, true
	case 7 * 24 * time.Hour:
		return algorithm.CalendarWeek, true
	case PeriodMonth:
		return algorithm.CalendarMonth, true
	case PeriodYear:
		return algorithm.CalendarYear, true
	}
	return 0, false
}

// calendars builds a rule's calendars, one per unit its rule and tiers use, so that the specs
// of a unit share one (and its cache of the current window).
type calendars struct {
	zone  string
	units map[algorithm.CalendarUnit]*algorithm.Calendar
}

// period checks a calendar rule's period (the rule's, or a tier's at field) and returns its
// calendar and nominal length; ok is false when it is not a calendar period, which it reports.
func (cs *calendars) period(field string, period time.Duration, bad func(field, format string, args ...any)) (*algorithm.Calendar, time.Duration, bool) {
	unit, ok := calendarUnit(period)
	if !ok {
		text, _ := Duration(period).MarshalText()
		bad(field, "with calendar must be 1d, 1w, 1mo or 1y, got %s", text)
		return nil, 0, false
	}
	if cal := cs.units[unit]; cal != nil {
		return cal, unit.Nominal(), true
	}
	cal, err := algorithm.NewCalendar(unit, cs.zone)
	if err != nil {
		return nil, 0, false // the zone was checked first; cannot happen
	}
	if cs.units == nil {
		cs.units = map[algorithm.CalendarUnit]*algorithm.Calendar{}
	}
	cs.units[unit] = cal
	return cal, unit.Nominal(), true
}

// compileCalendar checks a rule's calendar field against its algorithm and regions, and returns
// the calendars to build its specs with (nil for none). A mistake is reported and gives nil.
func compileCalendar(r *Rule, kind algorithm.Kind, bad func(field, format string, args ...any)) *calendars {
	zone := r.Calendar.Zone()
	if zone == "" {
		return nil
	}
	ok := true
	if kind != 0 && kind != algorithm.FixedWindow {
		bad("calendar", "applies only to fixed_window, not %s", kind)
		ok = false
	}
	if r.Regions != "" {
		bad("calendar", "cannot be combined with regions %q: calendar windows are counted per region", r.Regions)
		ok = false
	}
	if _, err := algorithm.NewCalendar(algorithm.CalendarDay, zone); err != nil {
		bad("calendar", "unknown time zone %q (want an IANA name such as Europe/Berlin or UTC, or true for UTC)", zone)
		ok = false
	}
	if !ok {
		return nil
	}
	return &calendars{zone: zone}
}
