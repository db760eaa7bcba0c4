package sluice_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestCalendarLimits checks calendar windows through the Limiter on the memory store with an
// injected clock: a Berlin day of 23 hours (the spring DST change) resets at local midnight,
// reset_after and retry_after count to it, and a Kolkata (+5:30) month resets on the 1st.
func TestCalendarLimits(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, `
rules:
  - {name: daily, match: {endpoint: /daily}, key: [user], algorithm: fixed_window, limit: 2, period: 1d, calendar: Europe/Berlin}
  - {name: monthly, match: {endpoint: /monthly}, key: [tenant], algorithm: fixed_window, limit: 3, period: 1mo, calendar: Asia/Kolkata}
`)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	at := func(when time.Time) {
		t.Helper()
		d := when.Sub(c.Now())
		if d < 0 {
			t.Fatalf("the clock cannot go back to %s", when)
		}
		c.Add(d)
	}
	type want struct {
		allowed      bool
		rule         string
		reset, retry time.Duration
	}
	expect := func(step string, r sluice.Request, w want) {
		t.Helper()
		d := check(t, l, r)
		if d.Allowed != w.allowed || d.Rule != w.rule || d.ResetAfter != w.reset || d.RetryAfter != w.retry {
			t.Fatalf("%s: allowed %v rule %s reset %s retry %s; want %v %s %s %s", step, d.Allowed, d.Rule, d.ResetAfter, d.RetryAfter,
				w.allowed, w.rule, w.reset, w.retry)
		}
	}
	// 00:30 CET on the day clocks go forward: 22h30m of the 23-hour day are left.
	at(time.Date(2027, 3, 28, 0, 30, 0, 0, berlin))
	ann := sluice.Request{User: "ann", Endpoint: "/daily"}
	expect("first of the day", ann, want{true, "daily", 22*time.Hour + 30*time.Minute, 0})
	expect("second", ann, want{true, "daily", 22*time.Hour + 30*time.Minute, 0})
	expect("third, denied", ann, want{false, "daily", 22*time.Hour + 30*time.Minute, 22*time.Hour + 30*time.Minute})
	at(time.Date(2027, 3, 28, 23, 59, 59, 0, berlin))
	expect("a second before midnight", ann, want{false, "daily", time.Second, time.Second})
	at(time.Date(2027, 3, 29, 0, 0, 0, 0, berlin))
	expect("at midnight", ann, want{true, "daily", 24 * time.Hour, 0})

	// The last minute of March in Kolkata, then the 1st of April.
	at(time.Date(2027, 3, 31, 23, 59, 0, 0, kolkata))
	acme := sluice.Request{Tenant: "acme", Endpoint: "/monthly"}
	for i := range 3 {
		expect("march "+string(rune('a'+i)), acme, want{true, "monthly", time.Minute, 0})
	}
	expect("march, denied", acme, want{false, "monthly", time.Minute, time.Minute})
	at(time.Date(2027, 4, 1, 0, 0, 0, 0, kolkata))
	expect("april", acme, want{true, "monthly", 30 * 24 * time.Hour, 0})
}
