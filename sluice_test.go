package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
)

var ctx = context.Background()

func newLimiter(t testing.TB, yml string) (*sluice.Limiter, *testutil.Clock) {
	t.Helper()
	c := testutil.NewClock()
	return testutil.Limiter(t, yml, c), c
}

func check(t testing.TB, l *sluice.Limiter, r sluice.Request) sluice.Decision {
	t.Helper()
	var d sluice.Decision
	if err := l.Check(ctx, &r, &d); err != nil {
		t.Fatalf("Check(%+v): %v", r, err)
	}
	return d
}

func TestThresholds(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: api, key: [user], algorithm: fixed_window, limit: 10, period: 1m, soft: 80, hard: 120}
`)
	var states []string
	for range 13 {
		d := check(t, l, sluice.Request{User: "u"})
		states = append(states, d.State.String())
	}
	// 1-7 normal; 8-10 past 80%: soft; 11-12 inside the 120% tolerance: soft; 13th hard.
	want := "normal normal normal normal normal normal normal soft soft soft soft soft hard"
	if got := strings.Join(states, " "); got != want {
		t.Errorf("states\n got %s\nwant %s", got, want)
	}
}

func TestAllOrNothingAcrossRules(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: per-second, key: [user], algorithm: token_bucket, limit: 100, period: 1s}
  - {name: per-day, key: [user], algorithm: fixed_window, limit: 3, period: 1d}
  - {name: global, key: [], algorithm: sliding_window_log, limit: 1000, period: 1m}
`)
	for i := range 5 {
		d := check(t, l, sluice.Request{User: "u"})
		if d.Allowed != (i < 3) {
			t.Fatalf("request %d allowed=%v", i, d.Allowed)
		}
		if !d.Allowed {
			if d.Rule != "per-day" || d.RetryAfter <= 0 || d.State != sluice.StateHard {
				t.Fatalf("denial reported rule %q retry %v state %v", d.Rule, d.RetryAfter, d.State)
			}
			// The other limits consumed nothing for the denied requests.
			if d.Results[0].Remaining != 97 || d.Results[2].Remaining != 997 {
				t.Fatalf("denied request consumed: %+v", d.Results)
			}
		}
	}
}

func TestDecidingLimitIsTheTightest(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: loose, key: [user], algorithm: gcra, limit: 100, period: 1s}
  - {name: tight, key: [user], algorithm: sliding_window_counter, limit: 5, period: 1m}
`)
	d := check(t, l, sluice.Request{User: "u"})
	if d.Rule != "tight" || d.Remaining != 4 || d.Limit != 5 || d.Scope != "user" {
		t.Errorf("deciding rule %q remaining %d limit %d scope %q", d.Rule, d.Remaining, d.Limit, d.Scope)
	}
}

func TestIdempotentRetryCountsOnce(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 5, period: 1h}\n")
	first := check(t, l, sluice.Request{User: "u", IdempotencyKey: "pay-42", Cost: 2})
	for range 3 {
		again := check(t, l, sluice.Request{User: "u", IdempotencyKey: "pay-42", Cost: 2})
		if !again.Replayed || again.Remaining != first.Remaining {
			t.Fatalf("retry: replayed=%v remaining=%d, first remaining=%d", again.Replayed, again.Remaining, first.Remaining)
		}
	}
	// The same key from another caller is another request.
	if d := check(t, l, sluice.Request{User: "v", IdempotencyKey: "pay-42"}); d.Replayed {
		t.Fatal("another user's request replayed u's decision")
	}
	if d := check(t, l, sluice.Request{User: "u"}); d.Remaining != 2 {
		t.Fatalf("remaining %d after one counted request of 2 and one of 1, want 2", d.Remaining)
	}
	c.Add(6 * time.Minute) // past the 5-minute TTL: a new request
	if d := check(t, l, sluice.Request{User: "u", IdempotencyKey: "pay-42", Cost: 2}); d.Replayed || d.Remaining != 0 {
		t.Fatalf("after TTL: replayed=%v remaining=%d", d.Replayed, d.Remaining)
	}
}

func TestExemptAndBanned(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, `
rules:
  - {name: r, key: [user], algorithm: fixed_window, limit: 1, period: 1h}
overrides:
  - {tenant: bad, type: ban, expires_at: "2026-11-23T13:00:00Z", reason: scraping}
exemptions:
  - {ip: 10.0.0.0/8}
`)
	for range 3 {
		if d := check(t, l, sluice.Request{User: "u", IP: "10.9.9.9"}); !d.Allowed || !d.Exempt {
			t.Fatalf("exempt caller: %+v", d)
		}
	}
	// Exempt requests were not counted.
	if d := check(t, l, sluice.Request{User: "u"}); !d.Allowed {
		t.Fatal("first counted request denied")
	}
	d := check(t, l, sluice.Request{User: "x", Tenant: "bad"})
	if d.Allowed || d.Reason != "banned: scraping" || d.RetryAfter != time.Hour {
		t.Fatalf("banned: allowed=%v reason=%q retry=%v", d.Allowed, d.Reason, d.RetryAfter)
	}
	if d := check(t, l, sluice.Request{User: "x"}); !d.Allowed {
		t.Fatal("a ban consumed the banned caller's quota")
	}
	c.Add(2 * time.Hour)
	if d := check(t, l, sluice.Request{User: "y", Tenant: "bad"}); !d.Allowed {
		t.Fatalf("ban outlived its expiry: %+v", d)
	}
}

func TestShadowReportsButAllows(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: s, key: [], algorithm: fixed_window, limit: 1, period: 1h, shadow: true}\n")
	check(t, l, sluice.Request{})
	d := check(t, l, sluice.Request{})
	if !d.Allowed || !d.Shadow || d.Results[0].Allowed {
		t.Fatalf("shadow: %+v", d)
	}
}

func TestNoRuleMatches(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: r, match: {endpoint: /x}, key: [], limit: 1, period: 1s}\n")
	d := check(t, l, sluice.Request{Endpoint: "/y"})
	if !d.Allowed || d.Rule != "" || len(d.Results) != 0 {
		t.Fatalf("%+v", d)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 3, period: 1h}\n")
	for _, r := range []sluice.Request{
		{User: "u", Cost: -1},
		{User: "u", IP: "not-an-ip"},
		{User: "u", Tenant: "\xff\xfe"},
		{User: "u", Endpoint: strings.Repeat("e", policy.MaxAttribute+1)},
	} {
		var d sluice.Decision
		err := l.Check(ctx, &r, &d)
		if !errors.Is(err, policy.ErrInvalid) {
			t.Errorf("Check(%.60v): err %v, want ErrInvalid", r, err)
		}
	}
	if _, err := l.Reset(ctx, &sluice.Request{User: "u"}, "nope"); !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("reset of unknown rule: %v", err)
	}
	var d sluice.Decision
	if err := l.Quota(ctx, &sluice.Request{User: "u"}, &d); err != nil || d.Remaining != 3 {
		t.Fatalf("bad input consumed quota: remaining %d, err %v", d.Remaining, err)
	}
}

func TestQuotaAndReset(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: a, key: [user], algorithm: token_bucket, limit: 5, period: 1m}
  - {name: b, key: [user], algorithm: sliding_window_log, limit: 5, period: 1m}
`)
	check(t, l, sluice.Request{User: "u", Cost: 3})
	var d sluice.Decision
	for range 2 {
		if err := l.Quota(ctx, &sluice.Request{User: "u"}, &d); err != nil || d.Remaining != 2 {
			t.Fatalf("quota remaining %d err %v, want 2 (and not consumed)", d.Remaining, err)
		}
	}
	n, err := l.Reset(ctx, &sluice.Request{User: "u"}, "a")
	if err != nil || n != 1 {
		t.Fatalf("reset: %d %v", n, err)
	}
	l.Quota(ctx, &sluice.Request{User: "u"}, &d)
	if d.Results[0].Remaining != 5 || d.Results[1].Remaining != 2 {
		t.Fatalf("after resetting rule a: %+v", d.Results)
	}
}

func TestLeakyBucketDelay(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: q, key: [], algorithm: leaky_bucket, limit: 10, period: 1s, burst: 5}\n")
	var delays []time.Duration
	for range 4 {
		delays = append(delays, check(t, l, sluice.Request{}).Delay)
	}
	want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("delays %v, want %v", delays, want)
		}
	}
}

func TestPolicySwap(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 2, period: 1h}\n")
	check(t, l, sluice.Request{User: "u"})
	check(t, l, sluice.Request{User: "u"})
	if d := check(t, l, sluice.Request{User: "u"}); d.Allowed {
		t.Fatal("third allowed at limit 2")
	}
	snap := testutil.Snapshot(t, "rules:\n  - {name: r, key: [user], algorithm: fixed_window, limit: 5, period: 1h}\n")
	if err := l.SetPolicy(snap); err != nil {
		t.Fatal(err)
	}
	// Raising the limit keeps the count: 2 used of 5.
	if d := check(t, l, sluice.Request{User: "u"}); !d.Allowed || d.Remaining != 2 || d.PolicyVersion != snap.Version {
		t.Fatalf("after raising the limit: %+v", d)
	}
}

func TestDecisionJSON(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, "rules:\n  - {name: \"we\\\"ird\\\\\", key: [user], algorithm: leaky_bucket, limit: 1, period: 1s}\n")
	check(t, l, sluice.Request{User: "u"})
	d := check(t, l, sluice.Request{User: "u"})
	var got map[string]any
	if err := json.Unmarshal(d.AppendJSON(nil), &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", d.AppendJSON(nil), err)
	}
	for k, want := range map[string]any{
		"allowed": false, "state": "hard", "limit": 1.0, "remaining": 0.0, "retry_after_ms": 1000.0,
		"rule": `we"ird\`, "scope": "user", "shadow": false, "exempt": false,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	results := got["results"].([]any)
	if len(results) != 1 || results[0].(map[string]any)["algorithm"] != "leaky_bucket" {
		t.Errorf("results %v", results)
	}
}
