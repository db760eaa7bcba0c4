package sluice_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store/breaker"
	"github.com/sluicehq/sluice/store/hotkey"
	"github.com/sluicehq/sluice/store/redis"
)

const idemPolicy = `
rules:
  - {name: per-user, key: [user], algorithm: fixed_window, limit: 10, period: 1h, tiers: {pro: {limit: 100}}, on_store_error: open}
  - {name: search, match: {endpoint: /search}, key: [user], algorithm: fixed_window, limit: 5, period: 1h, on_store_error: open}
  - {name: per-second, match: {endpoint: /burst}, key: [user], algorithm: fixed_window, limit: 1, period: 1s, on_store_error: open}
`

// idemLimiter is a Limiter of the idempotency tests, with what each test reads back.
type idemLimiter struct {
	name        string
	l           *sluice.Limiter
	clock       *testutil.Clock
	storeErrors func() int     // calls of the store error hook
	breaker     *breaker.Store // nil when unguarded
	redis       *redistest.Server
}

// idemLimiters are Limiters with the same policy over the memory store, a real Redis, and a
// real Redis behind the guards the service puts in front of it (hot keys over the breaker).
func idemLimiters(t *testing.T) []idemLimiter {
	t.Helper()
	var ls []idemLimiter
	c := testutil.NewClock()
	ls = append(ls, idemLimiter{name: "memory", l: testutil.Limiter(t, idemPolicy, c), clock: c, storeErrors: func() int { return 0 }})
	srv := redistest.Start(t)
	for _, guarded := range []bool{false, true} {
		// A clock a day ahead of the real one, on a whole day: Redis expires keys by it.
		c := testutil.NewClock()
		c.Add(time.Now().Add(48 * time.Hour).Truncate(24 * time.Hour).Sub(c.Now()))
		rs, err := redis.New(ctx, "redis://"+srv.Addr, redis.WithTimeForTests(c.Micros), redis.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var st sluice.Store = rs
		il := idemLimiter{name: "redis", clock: c, redis: srv}
		if guarded {
			il.name = "redis-guarded"
			il.breaker = breaker.New(rs, breaker.Options{Timeout: 5 * time.Second, MinCalls: 5})
			st = hotkey.New(il.breaker, hotkey.Options{})
		}
		errs := 0
		il.storeErrors = func() int { return errs }
		il.l, err = sluice.New(st, testutil.Snapshot(t, idemPolicy), sluice.WithClock(c.Now), sluice.WithStoreErrorHook(func(error) { errs++ }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { il.l.Close() })
		ls = append(ls, il)
	}
	return ls
}

// TestIdempotencyKeyBoundToRequest: a key replays only a retry of the request it was first used
// for. Reused with another cost, endpoint (another rule set) or tier it is refused with
// ErrIdempotencyMismatch, and the request consumes nothing; a denial is never remembered.
func TestIdempotencyKeyBoundToRequest(t *testing.T) {
	t.Parallel()
	type try struct {
		req          sluice.Request // User and IdempotencyKey are the case's own
		wantErr      error
		wantAllowed  bool
		wantReplayed bool
		waitRetry    bool // move the clock by the decision's RetryAfter
	}
	cases := []struct {
		name string
		// before is a request without a key, sent first.
		before *sluice.Request
		tries  []try
		// after is checked last (cost 0, a look) and must report these remaining units.
		after     sluice.Request
		remaining map[string]int64
	}{
		{"a retry replays", nil, []try{
			{req: sluice.Request{Cost: 2}, wantAllowed: true},
			{req: sluice.Request{Cost: 2}, wantAllowed: true, wantReplayed: true},
			{req: sluice.Request{Cost: 2}, wantAllowed: true, wantReplayed: true},
		}, sluice.Request{}, map[string]int64{"per-user": 8}},
		{"another cost is refused", nil, []try{
			{req: sluice.Request{Cost: 2}, wantAllowed: true},
			{req: sluice.Request{Cost: 3}, wantErr: sluice.ErrIdempotencyMismatch},
			{req: sluice.Request{Cost: 2}, wantAllowed: true, wantReplayed: true},
		}, sluice.Request{}, map[string]int64{"per-user": 8}},
		// The first request never touched search: the reuse must not pass for free.
		{"another endpoint is refused", nil, []try{
			{req: sluice.Request{Endpoint: "/items"}, wantAllowed: true},
			{req: sluice.Request{Endpoint: "/search"}, wantErr: sluice.ErrIdempotencyMismatch},
		}, sluice.Request{Endpoint: "/search"}, map[string]int64{"per-user": 9, "search": 5}},
		{"another tier is refused", nil, []try{
			{req: sluice.Request{}, wantAllowed: true},
			{req: sluice.Request{Tier: "pro"}, wantErr: sluice.ErrIdempotencyMismatch},
		}, sluice.Request{}, map[string]int64{"per-user": 9}},
		{"a denial is decided afresh after Retry-After", &sluice.Request{Endpoint: "/burst"}, []try{
			{req: sluice.Request{Endpoint: "/burst"}, wantAllowed: false, waitRetry: true},
			{req: sluice.Request{Endpoint: "/burst"}, wantAllowed: true},
			{req: sluice.Request{Endpoint: "/burst"}, wantAllowed: true, wantReplayed: true},
		}, sluice.Request{Endpoint: "/burst"}, map[string]int64{"per-user": 8, "per-second": 0}},
	}
	for _, il := range idemLimiters(t) {
		t.Run(il.name, func(t *testing.T) {
			for ci, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					user := fmt.Sprintf("%s-%d", il.name, ci)
					if tc.before != nil {
						r := *tc.before
						r.User = user
						check(t, il.l, r)
					}
					for i, try := range tc.tries {
						r := try.req
						r.User, r.IdempotencyKey = user, "pay-42"
						var d sluice.Decision
						err := il.l.Check(ctx, &r, &d)
						if try.wantErr != nil {
							if !errors.Is(err, try.wantErr) {
								t.Fatalf("try %d: err %v, want %v", i, err, try.wantErr)
							}
							continue
						}
						if err != nil {
							t.Fatalf("try %d: %v", i, err)
						}
						if d.Allowed != try.wantAllowed || d.Replayed != try.wantReplayed || d.Degraded {
							t.Fatalf("try %d: allowed=%v replayed=%v degraded=%v, want %v and %v", i, d.Allowed, d.Replayed, d.Degraded, try.wantAllowed, try.wantReplayed)
						}
						if try.waitRetry {
							il.clock.Add(d.RetryAfter)
						}
					}
					r := tc.after
					r.User = user
					var d sluice.Decision
					if err := il.l.Quota(ctx, &r, &d); err != nil {
						t.Fatal(err)
					}
					for _, res := range d.Results {
						if want, ok := tc.remaining[res.Rule]; ok && res.Remaining != want {
							t.Errorf("%s: remaining %d, want %d", res.Rule, res.Remaining, want)
						}
					}
				})
			}
			// A reused key is the caller's mistake: no store error, no degraded decision, and the
			// breaker does not open however many there are.
			t.Run("reuses are not store failures", func(t *testing.T) {
				user := il.name + "-reuses"
				check(t, il.l, sluice.Request{User: user, IdempotencyKey: "k", Cost: 1})
				for i := range 50 {
					var d sluice.Decision
					err := il.l.Check(ctx, &sluice.Request{User: user, IdempotencyKey: "k", Cost: 2}, &d)
					if !errors.Is(err, sluice.ErrIdempotencyMismatch) || d.Allowed {
						t.Fatalf("reuse %d: err %v allowed %v, want ErrIdempotencyMismatch", i, err, d.Allowed)
					}
				}
				if n := il.storeErrors(); n != 0 {
					t.Errorf("%d store errors reported for reused keys", n)
				}
				if il.breaker != nil && il.breaker.State() != "closed" {
					t.Errorf("breaker %s after 50 reused keys, want closed", il.breaker.State())
				}
				if d := check(t, il.l, sluice.Request{User: user}); d.Remaining != 8 || d.Degraded {
					t.Errorf("after the reuses: remaining %d degraded %v, want 8 (1 + this 1)", d.Remaining, d.Degraded)
				}
			})
			if il.redis == nil {
				return
			}
			// Denied requests leave nothing in Redis (the store's tests send 30,000).
			t.Run("denials leave no record", func(t *testing.T) {
				user := il.name + "-flood"
				check(t, il.l, sluice.Request{User: user, Endpoint: "/burst"})
				before, err := il.redis.Do("DBSIZE")
				if err != nil {
					t.Fatal(err)
				}
				for i := range 1000 {
					d := check(t, il.l, sluice.Request{User: user, Endpoint: "/burst", IdempotencyKey: strconv.Itoa(i)})
					if d.Allowed {
						t.Fatalf("request %d allowed", i)
					}
				}
				if after, err := il.redis.Do("DBSIZE"); err != nil || after != before {
					t.Fatalf("Redis keys %s before 1,000 denied requests, %s after (%v)", before, after, err)
				}
			})
		})
	}
}
