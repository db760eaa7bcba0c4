package sluice_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/breaker"
	"github.com/sluicehq/sluice/store/hotkey"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// leasePolicy has a rule of each algorithm, one endpoint each, keyed per user, and a global
// bucket every request also takes from: on a Cluster a reservation spans two slots.
const leasePolicy = `
rules:
  - {name: tb, match: {endpoint: /token_bucket}, key: [user], algorithm: token_bucket, limit: 10, period: 1h}
  - {name: gcra, match: {endpoint: /gcra}, key: [user], algorithm: gcra, limit: 10, period: 1h}
  - {name: leaky, match: {endpoint: /leaky_bucket}, key: [user], algorithm: leaky_bucket, limit: 10, period: 1h}
  - {name: fw, match: {endpoint: /fixed_window}, key: [user], algorithm: fixed_window, limit: 10, period: 1h}
  - {name: log, match: {endpoint: /sliding_window_log}, key: [user], algorithm: sliding_window_log, limit: 10, period: 1h}
  - {name: swc, match: {endpoint: /sliding_window_counter}, key: [user], algorithm: sliding_window_counter, limit: 10, period: 1h}
  - {name: conc, match: {endpoint: /concurrency}, key: [user], algorithm: concurrency, limit: 2}
  - {name: global, key: [], algorithm: token_bucket, limit: 100000, period: 1h}
`

type leaseLimiter struct {
	name  string
	l     *sluice.Limiter
	clock *testutil.Clock
	// expire moves the store's clock past a lease's ttl; Redis expires it by its own.
	expire func(ttl time.Duration)
}

// leaseLimiters are Limiters of leasePolicy over the memory store, one Redis, one Redis behind
// the service's guards (hot keys over the breaker), and a 3-node Cluster.
func leaseLimiters(t *testing.T) []leaseLimiter {
	t.Helper()
	dayAhead := func() *testutil.Clock {
		// A day ahead of the real clock, a minute into an hour: Redis expires keys by real
		// time, and no 1h window rolls during the test.
		c := testutil.NewClock()
		c.Add(time.Now().Add(24 * time.Hour).Truncate(time.Hour).Add(time.Minute).Sub(c.Now()))
		return c
	}
	var ls []leaseLimiter
	c := dayAhead()
	mem := memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0))
	ml, err := sluice.New(mem, testutil.Snapshot(t, leasePolicy), sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Close() })
	ls = append(ls, leaseLimiter{name: "memory", l: ml, clock: c, expire: func(ttl time.Duration) { c.Add(ttl) }})
	srv := redistest.Start(t)
	urls := []string{"redis://" + srv.Addr, "redis://" + srv.Addr}
	names := []string{"redis", "redis-guarded"}
	if !testing.Short() {
		cl := redistest.StartCluster(t, 3, 0)
		urls, names = append(urls, "redis-cluster://"+strings.Join(cl.Addrs, ",")), append(names, "cluster")
	}
	for i, url := range urls {
		c := dayAhead()
		rs, err := redis.New(ctx, url, redis.WithTimeForTests(c.Micros), redis.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var st sluice.Store = rs
		if names[i] == "redis-guarded" {
			st = hotkey.New(breaker.New(rs, breaker.Options{Timeout: 5 * time.Second, MinCalls: 5}), hotkey.Options{})
		}
		l, err := sluice.New(st, testutil.Snapshot(t, leasePolicy), sluice.WithClock(c.Now))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, leaseLimiter{name: names[i], l: l, clock: c, expire: func(time.Duration) {}})
	}
	return ls
}

// leaseLeft looks at rule's limit for user on endpoint.
func leaseLeft(t *testing.T, l *sluice.Limiter, user, endpoint, rule string) int64 {
	t.Helper()
	var d sluice.Decision
	if err := l.Quota(ctx, &sluice.Request{Tenant: "acme", User: user, Endpoint: endpoint}, &d); err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Results {
		if r.Rule == rule {
			return r.Remaining
		}
	}
	t.Fatalf("no result of rule %s for %s", rule, endpoint)
	return 0
}

// TestReservations: for every algorithm and store, a reservation takes its estimate, a commit
// gives back what was not used (or takes the excess past the limit), a release gives it all
// back, settling again answers as the first and changes nothing, a denial consumes nothing,
// and an expired lease stays committed at its estimate.
func TestReservations(t *testing.T) {
	t.Parallel()
	rules := map[string]string{
		"/token_bucket": "tb", "/gcra": "gcra", "/leaky_bucket": "leaky", "/fixed_window": "fw",
		"/sliding_window_log": "log", "/sliding_window_counter": "swc",
	}
	for _, ll := range leaseLimiters(t) {
		t.Run(ll.name, func(t *testing.T) {
			l := ll.l
			for endpoint, rule := range rules {
				user := ll.name + rule
				left := func() int64 { return leaseLeft(t, l, user, endpoint, rule) }
				global := func() int64 { return leaseLeft(t, l, user, endpoint, "global") }
				reserve := func(cost int64) (*sluice.Lease, *sluice.Decision) {
					t.Helper()
					var d sluice.Decision
					lease, err := l.Reserve(ctx, &sluice.Request{Tenant: "acme", User: user, Endpoint: endpoint, Cost: cost}, 0, &d)
					if err != nil {
						t.Fatalf("%s: reserve %d: %v", rule, cost, err)
					}
					return lease, &d
				}
				g0 := global()
				lease, d := reserve(8)
				if lease == nil || !d.Allowed || lease.Reserved != 8 || left() != 2 {
					t.Fatalf("%s: reserve 8 of 10: lease %+v, allowed %v, %d left", rule, lease, d.Allowed, left())
				}
				s, err := lease.Commit(ctx, 3)
				if err != nil || s.Repeated || s.Used != 3 || s.Reserved != 8 {
					t.Fatalf("%s: commit 3: %+v, %v", rule, s, err)
				}
				if got := left(); got != 7 {
					t.Fatalf("%s: reserved 8, used 3: %d left, want 7", rule, got)
				}
				if got := g0 - global(); got != 3 {
					t.Fatalf("%s: the global limit (another slot on a Cluster) is down %d, want 3", rule, got)
				}
				// Settling again answers as the first and changes nothing.
				s, err = lease.Commit(ctx, 9)
				if err != nil || !s.Repeated || s.Used != 3 || left() != 7 {
					t.Fatalf("%s: a second commit: %+v, %v, %d left; want the first's answer, 7 left", rule, s, err, left())
				}
				if s, err = lease.Release(ctx); err != nil || !s.Repeated || left() != 7 {
					t.Fatalf("%s: release after commit: %+v, %v, %d left", rule, s, err, left())
				}
				// A release gives everything back.
				lease, _ = reserve(5)
				if _, err := lease.Release(ctx); err != nil || left() != 7 {
					t.Fatalf("%s: reserve 5, release: %v, %d left, want 7", rule, err, left())
				}
				// A denial consumes nothing and issues no lease.
				if lease, d := reserve(9); lease != nil || d.Allowed || left() != 7 {
					t.Fatalf("%s: reserve 9 of 7 left: lease %v, allowed %v, %d left", rule, lease, d.Allowed, left())
				}
				// Using more than reserved takes the excess even past the limit.
				lease, _ = reserve(5)
				if _, err := lease.Commit(ctx, 12); err != nil {
					t.Fatal(err)
				}
				if got := left(); got != 0 {
					t.Fatalf("%s: 7 left, reserved 5, used 12: %d left, want 0", rule, got)
				}
				if lease, _ := reserve(1); lease != nil {
					t.Fatalf("%s: a reservation allowed past a limit overdrawn by an excess", rule)
				}
			}
		})
	}
}

// TestLeaseExpiry: a lease nobody settles stays committed at its estimate, and once expired
// cannot be settled (ErrUnknownLease), on every store.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	for _, ll := range leaseLimiters(t) {
		t.Run(ll.name, func(t *testing.T) {
			var d sluice.Decision
			lease, err := ll.l.Reserve(ctx, &sluice.Request{Tenant: "acme", User: ll.name + "exp", Endpoint: "/fixed_window", Cost: 6}, 100*time.Millisecond, &d)
			if err != nil || lease == nil {
				t.Fatalf("reserve: %v, %v", lease, err)
			}
			// A renewed lease outlives its first ttl.
			renewed, err := ll.l.Reserve(ctx, &sluice.Request{Tenant: "acme", User: ll.name + "exp", Endpoint: "/fixed_window", Cost: 2}, 100*time.Millisecond, &d)
			if err != nil || renewed == nil {
				t.Fatalf("reserve: %v, %v", renewed, err)
			}
			if err := renewed.Renew(ctx, 10*time.Second); err != nil {
				t.Fatalf("renew: %v", err)
			}
			ll.expire(200 * time.Millisecond)
			time.Sleep(300 * time.Millisecond) // Redis expires the record by its own clock
			if s, err := renewed.Release(ctx); err != nil || s.Repeated {
				t.Fatalf("release a renewed lease past its first ttl: %+v, %v", s, err)
			}
			if err := renewed.Renew(ctx, time.Second); !errors.Is(err, sluice.ErrLeaseSettled) {
				t.Fatalf("renew a settled lease: %v, want ErrLeaseSettled", err)
			}
			if _, err := lease.Commit(ctx, 0); !errors.Is(err, sluice.ErrUnknownLease) {
				t.Fatalf("a lease of 100ms, 300ms later: %v, want ErrUnknownLease", err)
			}
			if got := leaseLeft(t, ll.l, ll.name+"exp", "/fixed_window", "fw"); got != 4 {
				t.Fatalf("expired lease of 6: %d left, want 4 (committed at the estimate)", got)
			}
		})
	}
}

// TestLeaseHostileInput: bad settlements are clear errors and change nothing.
func TestLeaseHostileInput(t *testing.T) {
	t.Parallel()
	for _, ll := range leaseLimiters(t)[:2] {
		t.Run(ll.name, func(t *testing.T) {
			l := ll.l
			var d sluice.Decision
			req := &sluice.Request{Tenant: "acme", User: "hostile", Endpoint: "/token_bucket", Cost: 4}
			lease, err := l.Reserve(ctx, req, 0, &d)
			if err != nil || lease == nil {
				t.Fatal(lease, err)
			}
			for _, c := range []struct {
				name, tenant, id string
				used             int64
				want             error
				field            string
			}{
				{"negative used", "acme", lease.ID, -1, policy.ErrInvalid, "used"},
				{"huge used", "acme", lease.ID, 1 << 40, policy.ErrInvalid, "used"},
				{"malformed id", "acme", "ls_zz", 1, policy.ErrInvalid, "lease"},
				{"unknown id", "acme", "ls_00000000000000000000000000000000", 1, sluice.ErrUnknownLease, ""},
				{"another tenant", "evil", lease.ID, 0, sluice.ErrUnknownLease, ""},
			} {
				_, err := l.Commit(ctx, c.tenant, c.id, c.used)
				if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field) {
					t.Errorf("%s: %v, want %v naming %q", c.name, err, c.want, c.field)
				}
			}
			if got := leaseLeft(t, l, "hostile", "/token_bucket", "tb"); got != 6 {
				t.Fatalf("after the hostile settlements: %d left, want 6", got)
			}
			// The lease is still the owner's to settle.
			if s, err := lease.Commit(ctx, 1); err != nil || s.Repeated {
				t.Fatalf("owner's commit after hostile ones: %+v, %v", s, err)
			}
			if got := leaseLeft(t, l, "hostile", "/token_bucket", "tb"); got != 9 {
				t.Fatalf("reserved 4, used 1: %d left, want 9", got)
			}
			for _, c := range []struct {
				name  string
				ttl   time.Duration
				req   sluice.Request
				field string
			}{
				{"huge ttl", 2 * time.Hour, sluice.Request{Tenant: "acme", User: "hostile", Endpoint: "/token_bucket"}, "ttl"},
				{"negative ttl", -time.Second, sluice.Request{Tenant: "acme", User: "hostile", Endpoint: "/token_bucket"}, "ttl"},
				{"idempotency key", 0, sluice.Request{Tenant: "acme", User: "hostile", Endpoint: "/token_bucket", IdempotencyKey: "k"}, "idempotency_key"},
				{"negative cost", 0, sluice.Request{Tenant: "acme", User: "hostile", Endpoint: "/token_bucket", Cost: -3}, "cost"},
			} {
				lease, err := l.Reserve(ctx, &c.req, c.ttl, &d)
				if lease != nil || !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
					t.Errorf("%s: %v, %v; want ErrInvalid naming %s", c.name, lease, err, c.field)
				}
			}
			if got := leaseLeft(t, l, "hostile", "/token_bucket", "tb"); got != 9 {
				t.Fatalf("after refused reservations: %d left, want 9", got)
			}
		})
	}
}

// TestReserveNeedsALeaser: a store that keeps no leases refuses reservations by name.
func TestReserveNeedsALeaser(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	l, err := sluice.New(noLeases{memory.New(memory.WithClock(c.Micros))}, testutil.Snapshot(t, leasePolicy), sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var d sluice.Decision
	if _, err := l.Reserve(ctx, &sluice.Request{User: "u", Endpoint: "/gcra"}, 0, &d); err == nil || !strings.Contains(err.Error(), "keeps no leases") {
		t.Fatalf("reserve on a store without leases: %v", err)
	}
}

// noLeases is a store with only store.Store's methods.
type noLeases struct{ store.Store }
