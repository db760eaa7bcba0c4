package sluice_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// The built-in policy's shape: a bucket, a sliding counter and a shadow global rule, so a ban
// resolves real and shadow limits together (issue 30, first hour with the README).
const answerPolicy = `
rules:
  - {name: per-second, key: [user], algorithm: token_bucket, limit: 10, period: 1s, burst: 20}
  - {name: per-minute, key: [tenant, user], algorithm: sliding_window_counter, limit: 300, period: 1m}
  - {name: global, key: [], algorithm: gcra, limit: 100000, period: 1s, shadow: true}
  - {name: tiny-shadow, match: {endpoint: /tiny}, key: [user], algorithm: fixed_window, limit: 1, period: 1h, shadow: true}
  - {name: tiny, match: {endpoint: /tiny}, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
overrides:
  - {tenant: spammy, type: ban, expires_at: "2026-11-23T13:00:00Z", reason: scraping}
  - {user: nobody-else, type: ban, expires_at: "2026-11-23T13:00:00Z", reason: gone}
`

// checkAnswer holds d to the wire contract's invariants (DESIGN.md, Limits and algorithms):
// remaining within [0, limit], reset_after never below retry_after, and a denial that never
// says shadow.
func checkAnswer(t *testing.T, d *sluice.Decision) {
	t.Helper()
	if !d.Allowed && d.Shadow {
		t.Errorf("a denial says shadow: %+v", d)
	}
	if d.ResetAfter < d.RetryAfter {
		t.Errorf("decision: reset_after %v < retry_after %v", d.ResetAfter, d.RetryAfter)
	}
	if d.Remaining < 0 || (len(d.Results) > 0 && d.Remaining > d.Limit) {
		t.Errorf("decision: remaining %d outside [0, limit %d]", d.Remaining, d.Limit)
	}
	for _, r := range d.Results {
		if r.ResetAfter < r.RetryAfter {
			t.Errorf("%s: reset_after %v < retry_after %v", r.Rule, r.ResetAfter, r.RetryAfter)
		}
		if r.Remaining < 0 || r.Remaining > r.Limit {
			t.Errorf("%s: remaining %d outside [0, limit %d]", r.Rule, r.Remaining, r.Limit)
		}
	}
}

// TestBanAnswer: a ban's 429 names the ban's wait as both retry_after and reset_after, and
// never says shadow, although a shadow rule applied to the request.
func TestBanAnswer(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, answerPolicy)
	c.Add(16 * time.Second)
	for _, req := range []sluice.Request{
		{Tenant: "spammy", User: "x"}, // limits apply: the ban decides through them
		{User: "nobody-else", Endpoint: "/none"},
	} {
		d := check(t, l, req)
		if d.Allowed || d.State != sluice.StateHard || d.Reason != "banned: scraping" && d.Reason != "banned: gone" {
			t.Fatalf("%+v: allowed=%v state=%v reason=%q, want a ban", req, d.Allowed, d.State, d.Reason)
		}
		const wait = time.Hour - 16*time.Second // to the ban's end
		if d.RetryAfter != wait || d.ResetAfter != wait {
			t.Errorf("%+v: retry_after %v, reset_after %v; want both %v", req, d.RetryAfter, d.ResetAfter, wait)
		}
		if d.Shadow {
			t.Errorf("%+v: a ban's denial says shadow", req)
		}
		checkAnswer(t, &d)
		for _, r := range d.Results {
			if r.Shadow && (!r.Allowed || r.Reason != "") {
				t.Errorf("%+v: the shadow rule %s says allowed=%v reason=%q under the ban; want its own look", req, r.Rule, r.Allowed, r.Reason)
			}
		}
		// The top-level fields, before the results (a full shadow limit may say 0 there).
		if b, _, _ := strings.Cut(string(d.AppendJSON(nil)), `"results"`); !strings.Contains(b, `"shadow":false`) || strings.Contains(b, `"reset_after_ms":0,`) {
			t.Errorf("%+v: answer %s", req, b)
		}
	}
}

// TestDenialNeverSaysShadow: a real limit denies while a shadow limit would have too; the
// answer is the real limit's, and shadow is reserved for allowed requests a shadow limit
// would have denied.
func TestDenialNeverSaysShadow(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, answerPolicy)
	req := sluice.Request{User: "ann", Endpoint: "/tiny"}
	if d := check(t, l, req); !d.Allowed || d.Shadow {
		t.Fatalf("first: allowed=%v shadow=%v, want allowed, no shadow", d.Allowed, d.Shadow)
	}
	d := check(t, l, req)
	if d.Allowed || d.Shadow || d.Rule != "tiny" {
		t.Fatalf("second: allowed=%v shadow=%v rule=%s, want denied by tiny, no shadow", d.Allowed, d.Shadow, d.Rule)
	}
	checkAnswer(t, &d)
}

// TestBucketNumbers: the numbers of the built-in policy's first check (issue 30): a bucket of
// rate 10/s and burst 20 answers limit 20 (what can be spent at once), remaining 19, and its
// rate as the quota; after a burst, remaining never exceeds limit and reset_after never falls
// below retry_after, for every algorithm and with a hard threshold's tolerance.
func TestBucketNumbers(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, answerPolicy)
	d := check(t, l, sluice.Request{User: "alice"})
	if d.Rule != "per-second" || d.Limit != 20 || d.Remaining != 19 {
		t.Fatalf("first check: rule %s limit %d remaining %d, want per-second 20 19", d.Rule, d.Limit, d.Remaining)
	}
	if r := d.Results[0]; r.Quota != 10 || r.Period != time.Second || r.Limit != 20 {
		t.Errorf("bucket result: quota %d per %v, limit %d; want 10 per 1s, limit 20", r.Quota, r.Period, r.Limit)
	}
	checkAnswer(t, &d)

	const every = `
rules:
  - {name: tb, match: {endpoint: /tb}, key: [user], algorithm: token_bucket, limit: 10, period: 1s, burst: 20}
  - {name: gcra, match: {endpoint: /gcra}, key: [user], algorithm: gcra, limit: 10, period: 1s, burst: 5}
  - {name: leaky, match: {endpoint: /leaky}, key: [user], algorithm: leaky_bucket, limit: 10, period: 1s, burst: 20}
  - {name: fixed, match: {endpoint: /fixed}, key: [user], algorithm: fixed_window, limit: 10, period: 1m}
  - {name: log, match: {endpoint: /log}, key: [user], algorithm: sliding_window_log, limit: 10, period: 1m}
  - {name: counter, match: {endpoint: /counter}, key: [user], algorithm: sliding_window_counter, limit: 10, period: 1m}
  - {name: tolerant, match: {endpoint: /tolerant}, key: [user], algorithm: fixed_window, limit: 10, period: 1m, hard: 130}
`
	l, c = newLimiter(t, every)
	for _, ep := range []string{"/tb", "/gcra", "/leaky", "/fixed", "/log", "/counter", "/tolerant"} {
		for i := 0; i < 40; i++ {
			d := check(t, l, sluice.Request{User: "bob", Endpoint: ep})
			checkAnswer(t, &d)
			c.Add(7 * time.Millisecond)
		}
	}
}
