package sluice_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// One caller is one bucket however its attributes are spelled: an IP address written another
// way (IPv4-mapped IPv6, leading zeros, upper-case hex) or a method in another letter case must
// not open a fresh bucket, or a caller who controls the spelling escapes its limit.
func TestSpellingsShareABucket(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		rule      string
		spellings []sluice.Request
	}{
		{
			name: "IPv4 and IPv4-mapped IPv6",
			rule: "{name: r, key: [ip], algorithm: fixed_window, limit: 2, period: 1h}",
			spellings: []sluice.Request{
				{IP: "192.0.2.7"}, {IP: "::ffff:192.0.2.7"}, {IP: "::FFFF:192.0.2.7"},
			},
		},
		{
			name: "IPv6 spellings",
			rule: "{name: r, key: [ip], algorithm: fixed_window, limit: 2, period: 1h}",
			spellings: []sluice.Request{
				{IP: "2001:db8::1"}, {IP: "2001:0DB8:0:0:0:0:0:1"}, {IP: "2001:db8:0::0:1"},
			},
		},
		{
			name: "identity falls back to the IP",
			rule: "{name: r, key: [identity], algorithm: fixed_window, limit: 2, period: 1h}",
			spellings: []sluice.Request{
				{IP: "2001:db8::1"}, {IP: "2001:DB8::1"}, {IP: "2001:db8:0:0::1"},
			},
		},
		{
			name: "method letter case",
			rule: "{name: r, key: [method], algorithm: fixed_window, limit: 2, period: 1h}",
			spellings: []sluice.Request{
				{Method: "GET"}, {Method: "get"}, {Method: "Get"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, _ := newLimiter(t, "rules:\n  - "+tt.rule+"\n")
			for i, r := range tt.spellings {
				d := check(t, l, r)
				if want := i < 2; d.Allowed != want {
					t.Fatalf("spelling %d (%+v): allowed=%v, want %v: the spellings do not share one bucket", i, r, d.Allowed, want)
				}
			}
		})
	}
}

// A penalty multiplier throttles: one that rounds a small limit down to nothing still admits
// one request per period, rather than denying all of them as costs that can never fit.
func TestSmallMultiplierThrottlesRatherThanBans(t *testing.T) {
	t.Parallel()
	l, c := newLimiter(t, `
rules:
  - {name: r, key: [tenant, user], algorithm: fixed_window, limit: 5, period: 1m}
overrides:
  - {tenant: t, type: multiplier, value: 0.1, expires_at: "2026-11-24T00:00:00Z", reason: abuse}
`)
	for minute := range 2 {
		for i := range 3 {
			d := check(t, l, sluice.Request{Tenant: "t", User: "u"})
			if want := i == 0; d.Allowed != want || d.Limit != 1 {
				t.Fatalf("minute %d request %d: allowed=%v limit=%d reason=%q; want allowed=%v under a limit of 1", minute, i, d.Allowed, d.Limit, d.Reason, want)
			}
			if !d.Allowed && d.RetryAfter <= 0 {
				t.Fatalf("minute %d request %d: denied with no retry_after (%q): a throttle, not a cost that never fits", minute, i, d.Reason)
			}
		}
		c.Add(time.Minute)
	}
}

// A request lacking the identity a limit keys on shares that limit's one bucket with every
// request like it; the decision says so, for the sluice_requests_without_identity_total count.
func TestRequestsWithoutIdentityAreMarked(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: per-caller, key: [identity], algorithm: fixed_window, limit: 2, period: 1h}
  - {name: per-user, match: {endpoint: /u}, key: [tenant, user], algorithm: fixed_window, limit: 100, period: 1h}
  - {name: per-tenant, match: {endpoint: /t}, key: [tenant], algorithm: fixed_window, limit: 100, period: 1h}
`)
	tests := []struct {
		name string
		req  sluice.Request
		want bool
	}{
		{"no identity at all", sluice.Request{Tenant: "t"}, true},
		{"an api key", sluice.Request{APIKey: "k"}, false},
		{"a user", sluice.Request{User: "u"}, false},
		{"an ip", sluice.Request{IP: "192.0.2.1"}, false},
		{"a rule keyed on user, no user", sluice.Request{Tenant: "t", IP: "192.0.2.1", Endpoint: "/u"}, true},
		{"a rule keyed on tenant only", sluice.Request{IP: "192.0.2.1", Endpoint: "/t"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(t, l, tt.req)
			if d.Anonymous != tt.want {
				t.Fatalf("Anonymous = %v, want %v", d.Anonymous, tt.want)
			}
			if got := strings.Contains(string(d.AppendJSON(nil)), `"anonymous":true`); got != tt.want {
				t.Fatalf("JSON says anonymous: %v, want %v", got, tt.want)
			}
		})
	}
	// And they do share: two anonymous callers spend one bucket.
	check(t, l, sluice.Request{Tenant: "other"})
	if d := check(t, l, sluice.Request{Tenant: "another"}); d.Allowed {
		t.Fatalf("a third anonymous request was allowed: anonymous requests do not share per-caller's bucket")
	}
}
