package sluice_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/policy"
)

// The deciding limit, whose rule the top-level fields and the warning header name, follows the
// worst state first and only then the least remaining: a soft limit with room left speaks
// before a normal one with less.
func TestDecidingLimitFollowsTheWorstState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		policy    string
		requests  int
		wantRule  string
		wantState sluice.State
	}{
		{
			name: "soft with more remaining beats normal with less",
			policy: `
rules:
  - {name: roomy-soft, key: [user], algorithm: fixed_window, limit: 100, period: 1h, soft: 10}
  - {name: tight-normal, key: [user], algorithm: fixed_window, limit: 50, period: 1h}
`,
			requests: 20, wantRule: "roomy-soft", wantState: sluice.StateSoft,
		},
		{
			name: "the tighter of two soft limits",
			policy: `
rules:
  - {name: a, key: [user], algorithm: fixed_window, limit: 100, period: 1h, soft: 10}
  - {name: b, key: [user], algorithm: fixed_window, limit: 50, period: 1h, soft: 10}
`,
			requests: 20, wantRule: "b", wantState: sluice.StateSoft,
		},
		{
			name: "tolerance past the nominal limit is soft",
			policy: `
rules:
  - {name: tolerant, key: [user], algorithm: fixed_window, limit: 10, period: 1h, hard: 200}
  - {name: roomy, key: [user], algorithm: fixed_window, limit: 12, period: 1h}
`,
			requests: 11, wantRule: "tolerant", wantState: sluice.StateSoft,
		},
		{
			name: "all normal: least remaining",
			policy: `
rules:
  - {name: loose, key: [user], algorithm: fixed_window, limit: 100, period: 1h}
  - {name: tight, key: [user], algorithm: fixed_window, limit: 30, period: 1h}
`,
			requests: 5, wantRule: "tight", wantState: sluice.StateNormal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, _ := newLimiter(t, tt.policy)
			var d sluice.Decision
			for range tt.requests {
				d = check(t, l, sluice.Request{User: "u"})
			}
			if !d.Allowed || d.State != tt.wantState || d.Rule != tt.wantRule {
				t.Fatalf("allowed=%v state=%v rule=%q; want allowed, %v, %q", d.Allowed, d.State, d.Rule, tt.wantState, tt.wantRule)
			}
			h := http.Header{}
			httplimit.SetHeaders(h, &d)
			warning := h.Get("X-RateLimit-Warning")
			if tt.wantState == sluice.StateSoft && !strings.Contains(warning, `"`+tt.wantRule+`"`) {
				t.Errorf("X-RateLimit-Warning %q does not name %q", warning, tt.wantRule)
			}
			if tt.wantState == sluice.StateNormal && warning != "" {
				t.Errorf("X-RateLimit-Warning %q in the normal state", warning)
			}
		})
	}
}

// A reset that names a rule the attributes do not address resets nothing, and says why rather
// than answering keys_reset: 0 as if it had worked.
func TestResetOfARuleTheRequestDoesNotAddress(t *testing.T) {
	t.Parallel()
	l, _ := newLimiter(t, `
rules:
  - {name: search, match: {endpoint: /api/search}, key: [user], algorithm: fixed_window, limit: 5, period: 1m}
  - {name: any, key: [user], algorithm: fixed_window, limit: 5, period: 1m}
`)
	tests := []struct {
		name    string
		req     sluice.Request
		rule    string
		wantN   int
		wantErr string // the field the error names; "" for success
	}{
		{name: "addressed rule", req: sluice.Request{User: "u", Endpoint: "/api/search"}, rule: "search", wantN: 1},
		{name: "every addressed rule", req: sluice.Request{User: "u", Endpoint: "/api/search"}, wantN: 2},
		{name: "rule whose match the body misses", req: sluice.Request{User: "u", Endpoint: "/other"}, rule: "search", wantErr: "rule"},
		{name: "unknown rule", req: sluice.Request{User: "u"}, rule: "nope", wantErr: "rule"},
		{name: "no rule addresses the body", req: sluice.Request{User: "u", Endpoint: "/x"}, wantN: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := l.Reset(ctx, &tt.req, tt.rule)
			if tt.wantErr == "" {
				if err != nil || n != tt.wantN {
					t.Fatalf("Reset = %d, %v; want %d, nil", n, err, tt.wantN)
				}
				return
			}
			var fe *policy.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.wantErr || !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("Reset = %d, %v; want an invalid-input error naming %q", n, err, tt.wantErr)
			}
		})
	}
}
