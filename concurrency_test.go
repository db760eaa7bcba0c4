package sluice_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestConcurrencyLeases: on every store (memory, Redis, Redis behind the guards, a Cluster
// where the global limit lives on another slot), a concurrency limit of 2 holds at most 2
// leases in flight; a check asks without taking a slot; a denied reservation takes nothing
// from any limit; a commit (whatever it used) frees the slot, once; a renewed slot outlives
// its first ttl; a slot nobody settles returns at its ttl, not before.
func TestConcurrencyLeases(t *testing.T) {
	t.Parallel()
	for _, ll := range leaseLimiters(t) {
		t.Run(ll.name, func(t *testing.T) {
			l, user := ll.l, ll.name+"-jobs"
			req := func() *sluice.Request {
				return &sluice.Request{Tenant: "acme", User: user, Endpoint: "/concurrency"}
			}
			inFlight := func() int64 { return 2 - leaseLeft(t, l, user, "/concurrency", "conc") }
			global := func() int64 { return leaseLeft(t, l, user, "/concurrency", "global") }
			reserve := func(ttl time.Duration) (*sluice.Lease, *sluice.Decision) {
				t.Helper()
				var d sluice.Decision
				lease, err := l.Reserve(ctx, req(), ttl, &d)
				if err != nil {
					t.Fatalf("reserve: %v", err)
				}
				return lease, &d
			}
			check := func() bool {
				t.Helper()
				var d sluice.Decision
				if err := l.Check(ctx, req(), &d); err != nil {
					t.Fatal(err)
				}
				return d.Allowed
			}
			if !check() || !check() || !check() || inFlight() != 0 {
				t.Fatalf("checks took slots: %d in flight", inFlight())
			}
			long, _ := reserve(10 * time.Second)
			short, _ := reserve(time.Second)
			if long == nil || short == nil || inFlight() != 2 {
				t.Fatalf("two reservations of 2 slots: %v %v, %d in flight", long, short, inFlight())
			}
			g := global()
			if lease, d := reserve(time.Second); lease != nil || d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("a third slot of 2: lease %v, allowed %v, retry after %s", lease, d.Allowed, d.RetryAfter)
			}
			if check() {
				t.Fatal("a check allowed with every slot held")
			}
			if got := global(); got != g {
				t.Fatalf("a denied reservation took %d from the global limit", g-got)
			}
			// Renewed, the long lease's slot outlives its first ttl.
			if err := long.Renew(ctx, time.Hour); err != nil {
				t.Fatal(err)
			}
			ll.clock.Add(999 * time.Millisecond)
			if got := inFlight(); got != 2 {
				t.Fatalf("1ms before the short lease's ttl: %d in flight, want 2", got)
			}
			ll.clock.Add(time.Millisecond)
			if got := inFlight(); got != 1 {
				t.Fatalf("at the short lease's ttl: %d in flight, want 1 (it returns by itself)", got)
			}
			ll.clock.Add(10 * time.Second)
			if got := inFlight(); got != 1 {
				t.Fatalf("past the long lease's first ttl, renewed: %d in flight, want 1", got)
			}
			// A commit frees the slot whatever it used, once.
			if s, err := long.Commit(ctx, 7); err != nil || s.Repeated {
				t.Fatalf("commit: %+v, %v", s, err)
			}
			if got := inFlight(); got != 0 {
				t.Fatalf("after the commit: %d in flight, want 0", got)
			}
			a, _ := reserve(time.Minute)
			if s, err := long.Release(ctx); err != nil || !s.Repeated || inFlight() != 1 {
				t.Fatalf("a repeated settlement: %+v, %v, %d in flight; want the first's answer and 1", s, err, inFlight())
			}
			if _, err := a.Release(ctx); err != nil || inFlight() != 0 {
				t.Fatalf("release: %v, %d in flight", err, inFlight())
			}
			if err := a.Renew(ctx, time.Minute); !errors.Is(err, sluice.ErrLeaseSettled) {
				t.Fatalf("renew a released lease: %v, want ErrLeaseSettled", err)
			}
		})
	}
}
