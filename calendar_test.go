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

// TestDrainOnDeny checks on_deny: drain through the Limiter on the memory store: a request over
// what is left empties the limit, so a request that would have fit waits for the refill; a
// rule without it keeps what was left, and a sibling's denial drains nothing.
func TestDrainOnDeny(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, `
rules:
  - {name: drained, match: {endpoint: /d}, key: [user], algorithm: token_bucket, limit: 10, period: 1s, on_deny: drain}
  - {name: kept, match: {endpoint: /k}, key: [user], algorithm: token_bucket, limit: 10, period: 1s}
  - {name: window, match: {endpoint: /w}, key: [user], algorithm: fixed_window, limit: 10, period: 1m, on_deny: drain}
  - {name: tight, match: {endpoint: /w}, key: [tenant], algorithm: fixed_window, limit: 8, period: 1m}
`)
	for _, tc := range []struct {
		endpoint       string
		allowedAfter   bool // a request of 1 after the denied one of 5
		remainingAfter int64
		deniedBy       string
	}{
		{"/d", false, 0, "drained"},
		{"/k", true, 2, "kept"},
	} {
		r := sluice.Request{User: "u" + tc.endpoint, Endpoint: tc.endpoint, Cost: 7}
		if d := check(t, l, r); !d.Allowed {
			t.Fatalf("%s: the first 7 denied", tc.endpoint)
		}
		r.Cost = 5
		if d := check(t, l, r); d.Allowed || d.Rule != tc.deniedBy {
			t.Fatalf("%s: 5 more allowed %v by %s", tc.endpoint, d.Allowed, d.Rule)
		}
		r.Cost = 1
		if d := check(t, l, r); d.Allowed != tc.allowedAfter || d.Remaining != tc.remainingAfter {
			t.Fatalf("%s: then 1: allowed %v remaining %d; want %v %d", tc.endpoint, d.Allowed, d.Remaining, tc.allowedAfter, tc.remainingAfter)
		}
	}
	c.Add(time.Second) // a full refill
	if d := check(t, l, sluice.Request{User: "u/d", Endpoint: "/d", Cost: 10}); !d.Allowed {
		t.Fatal("the drained bucket did not refill in a period")
	}
	// /w: 4 pass both; 5 more: the tenant's window (8) denies, the user's (10) would allow:
	// the user's window is not drained, and still has 6.
	r := sluice.Request{User: "w", Tenant: "t", Endpoint: "/w", Cost: 4}
	check(t, l, r)
	r.Cost = 5
	if d := check(t, l, r); d.Allowed || d.Rule != "tight" {
		t.Fatalf("denied by %s", d.Rule)
	}
	r.Tenant, r.Cost = "t2", 6
	if d := check(t, l, r); !d.Allowed || d.Results[0].Remaining != 0 {
		t.Fatalf("the user's window lost what was left to a sibling's denial: %+v", d.Results)
	}
}
