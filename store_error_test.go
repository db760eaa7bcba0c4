package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// TestStoreDown kills a real Redis under the limiter: each rule decides by its
// on_store_error, the decision says it was degraded, and nothing waits past the store's
// timeout.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := redis.New(context.Background(), "redis://"+srv.Addr, redis.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var storeErrors int
	snap := testutil.Snapshot(t, `
rules:
  - {name: open, match: {endpoint: /open}, key: [user], algorithm: fixed_window, limit: 1, period: 1h, on_store_error: open}
  - {name: closed, match: {endpoint: /closed}, key: [user], algorithm: fixed_window, limit: 1, period: 1h, on_store_error: closed}
  - {name: local, match: {endpoint: /local}, key: [user], algorithm: fixed_window, limit: 4, period: 1h, on_store_error: local}
`)
	lim, err := sluice.New(st, snap,
		sluice.WithFallback(memory.New(memory.WithSweepInterval(0))),
		sluice.WithLocalShare(2), // a fleet of 2: the local rule's 4 become 2 here
		sluice.WithStoreErrorHook(func(err error) {
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("store error %v does not wrap ErrUnavailable", err)
			}
			storeErrors++
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	checkAs := func(user, endpoint string) sluice.Decision {
		t.Helper()
		var d sluice.Decision
		if err := lim.Check(context.Background(), &sluice.Request{User: user, Endpoint: endpoint}, &d); err != nil {
			t.Fatalf("%s: %v", endpoint, err)
		}
		return d
	}
	check := func(endpoint string) sluice.Decision { t.Helper(); return checkAs("u", endpoint) }
	// A loaded machine can make the first calls (connecting, loading the script) outlast the
	// 200 ms timeout and degrade: wait, as other users, until Redis decides, so that what
	// follows tests a store that dies, not one that was slow to start.
	for i, deadline := 0, time.Now().Add(30*time.Second); checkAs(fmt.Sprint("warm-", i), "/open").Degraded; i++ {
		if time.Now().After(deadline) {
			t.Fatal("with Redis up, checks still degraded after 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The warm-up's last check was Redis's own decision; another one could be slow again on
	// a loaded machine, which is not what this test is about.
	storeErrors = 0
	srv.Kill()
	start := time.Now()
	if d := check("/open"); !d.Allowed || !d.Degraded {
		t.Errorf("open: allowed=%v degraded=%v, want allowed and degraded", d.Allowed, d.Degraded)
	}
	if d := check("/closed"); d.Allowed || !d.Degraded || d.Reason == "" {
		t.Errorf("closed: allowed=%v degraded=%v reason=%q, want denied, degraded, with a reason", d.Allowed, d.Degraded, d.Reason)
	}
	// local: the in-process limiter has this node's share of the rule's limit, 4 / 2.
	for i := range 3 {
		if d := check("/local"); d.Allowed != (i < 2) || !d.Degraded {
			t.Errorf("local request %d: allowed=%v degraded=%v", i, d.Allowed, d.Degraded)
		}
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("5 checks against a dead store took %v", elapsed)
	}
	if storeErrors < 5 {
		t.Errorf("%d store errors counted, want one per check", storeErrors)
	}
	// Redis back (empty: it persisted nothing): normal decisions resume without restarting
	// anything.
	srv.Restart(t)
	// A user per try: a try that timed out may still have been counted when Redis ran it late,
	// and that must not spend the limit of the try that is checked.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		d := checkAs(fmt.Sprint("back-", i), "/closed")
		if !d.Degraded {
			if !d.Allowed {
				t.Errorf("after Redis came back: %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("decisions still degraded 10 s after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
