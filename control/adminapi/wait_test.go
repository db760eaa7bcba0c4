package adminapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/adminapi"
)

// A change with wait=fleet answers once every live node reports its version; a node that
// lags past the timeout makes it 504 naming the node, with the change stored all the same.
func TestWaitForFleet(t *testing.T) {
	e := newEnv(t, func(o *adminapi.Options) { o.WaitTimeout = 300 * time.Millisecond })
	beat := func(id string, v int64) {
		t.Helper()
		if err := e.store.Heartbeat(e.ctx, control.Node{ID: id, Addr: id + ":8080", PolicyVersion: v}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("no live node", func(t *testing.T) {
		e.do(call{method: "POST", path: "/admin/v1/overrides?wait=fleet", role: control.RoleWrite,
			body: `{"tenant":"t0","type":"ban","ttl":"1h","reason":"r"}`}).want(t, 201)
	})

	t.Run("answers when the last node reports", func(t *testing.T) {
		beat("node-a", e.version())
		beat("node-b", e.version())
		next := e.version() + 1
		var reported atomic.Bool
		go func() {
			time.Sleep(50 * time.Millisecond)
			beat("node-a", next)
			time.Sleep(50 * time.Millisecond)
			reported.Store(true)
			beat("node-b", next+5)
		}()
		r := e.do(call{method: "POST", path: "/admin/v1/overrides", role: control.RoleWrite, header: map[string]string{"Sluice-Wait": "fleet"},
			body: `{"tenant":"t1","type":"ban","ttl":"1h","reason":"r"}`})
		r.want(t, 201)
		if !reported.Load() {
			t.Error("answered before node-b reported the change")
		}
		if r.str("tenant") != "t1" || r.header.Get("ETag") == "" || r.header.Get("Location") == "" {
			t.Errorf("answer: %v %s", r.header, r.raw)
		}
	})

	t.Run("504 names the lagging node", func(t *testing.T) {
		v := e.version()
		beat("node-a", v+1)
		beat("stale", v) // never reports the change
		start := time.Now()
		r := e.do(call{method: "PATCH", path: "/admin/v1/overrides/-1?wait=fleet", role: control.RoleWrite, body: `{"ttl":"1h"}`})
		r.want(t, 409) // a refused change does not wait
		r = e.do(call{method: "DELETE", path: "/admin/v1/rules/nope?wait=fleet", role: control.RoleWrite})
		r.want(t, 404)
		r = e.do(call{method: "POST", path: "/admin/v1/overrides?wait=fleet", role: control.RoleWrite,
			body: `{"tenant":"t2","type":"ban","ttl":"1h","reason":"r"}`})
		r.want(t, http.StatusGatewayTimeout)
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("504 after %v, before the timeout", took)
		}
		lag, _ := r.json["lagging"].([]any)
		if len(lag) != 1 || lag[0].(map[string]any)["id"] != "stale" || !strings.Contains(r.str("error"), "stale") {
			t.Errorf("504 body: %s", r.raw)
		}
		if r.header.Get(adminapi.PolicyVersionHeader) == "" || r.header.Get("ETag") != "" {
			t.Errorf("504 headers: %v", r.header)
		}
		if e.version() != v+1 {
			t.Errorf("version %d, want %d: the change is stored even when the wait runs out", e.version(), v+1)
		}
		list := e.do(call{method: "GET", path: "/admin/v1/overrides?tenant=t2", role: control.RoleRead}).want(t, 200)
		if len(list.json["overrides"].([]any)) != 1 {
			t.Errorf("override not stored: %s", list.raw)
		}
	})

	t.Run("bad values change nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name, path, field string
			header            map[string]string
		}{
			{"query", "/admin/v1/overrides?wait=all", "wait", nil},
			{"query twice", "/admin/v1/overrides?wait=fleet&wait=fleet", "wait", nil},
			{"header", "/admin/v1/overrides", "Sluice-Wait", map[string]string{"Sluice-Wait": "yes"}},
		} {
			v := e.version()
			r := e.doPlain(call{method: "POST", path: tc.path, role: control.RoleWrite, header: tc.header,
				body: `{"tenant":"t3","type":"ban","ttl":"1h","reason":"r"}`})
			if r.status != 400 || r.str("field") != tc.field || e.version() != v {
				t.Errorf("%s: %d %s (version %d -> %d), want 400 naming %s", tc.name, r.status, r.raw, v, e.version(), tc.field)
			}
		}
	})
}

// countingNodes counts the heartbeat reads of the real store it wraps.
type countingNodes struct {
	control.Store
	reads atomic.Int64
}

func (c *countingNodes) Nodes(ctx context.Context, since time.Time) ([]control.Node, error) {
	c.reads.Add(1)
	return c.Store.Nodes(ctx, since)
}

// Changes waiting for the fleet at once share the heartbeat reads (about one per poll,
// however many wait), and one more waiter than the bound is refused before it changes
// anything.
func TestWaitersShareAndAreBounded(t *testing.T) {
	const waiters = 6
	var counting *countingNodes
	e := newEnv(t, func(o *adminapi.Options) {
		o.WaitTimeout = time.Second
		o.MaxFleetWaiters = waiters
		counting = &countingNodes{Store: o.Control}
		o.Control = counting
	})
	if err := e.store.Heartbeat(e.ctx, control.Node{ID: "stale", Addr: "stale:8080", PolicyVersion: e.version()}); err != nil {
		t.Fatal(err)
	}
	v := e.version()
	start := time.Now()
	var wg sync.WaitGroup
	codes := make(chan int, waiters)
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.doPlain(call{method: "POST", path: "/admin/v1/overrides?wait=fleet", role: control.RoleWrite,
				body: fmt.Sprintf(`{"tenant":"w%d","type":"ban","ttl":"1h","reason":"r"}`, i)})
			codes <- r.status
		}()
	}
	// Every waiter has made its change (the version moved by one each) before one more comes.
	for deadline := time.Now().Add(30 * time.Second); e.version() < v+waiters; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the waiters' changes were not all made: version %d, want %d", e.version(), v+waiters)
		}
	}
	r := e.doPlain(call{method: "POST", path: "/admin/v1/overrides?wait=fleet", role: control.RoleWrite,
		body: `{"tenant":"one-more","type":"ban","ttl":"1h","reason":"r"}`})
	if r.status != http.StatusServiceUnavailable || r.str("field") != "wait" || r.header.Get("Retry-After") == "" || e.version() != v+waiters {
		t.Errorf("one waiter too many: %d %s (version %d, want %d unchanged), want 503 naming wait", r.status, r.raw, e.version(), v+waiters)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusGatewayTimeout {
			t.Errorf("a waiter answered %d, want 504 (the stale node never reports)", c)
		}
	}
	// Unshared, each waiter would read once per poll: waiters times this bound.
	polls := time.Since(start)/(20*time.Millisecond) + 1
	if reads := counting.reads.Load(); reads > int64(polls)+waiters {
		t.Errorf("%d heartbeat reads in %d polls' time by %d waiters, want about one per poll", reads, polls, waiters)
	}
	// The bound is per waiting change, not per change: with the waiters gone, one waits again.
	if got := e.doPlain(call{method: "POST", path: "/admin/v1/overrides?wait=fleet", role: control.RoleWrite,
		body: `{"tenant":"after","type":"ban","ttl":"1h","reason":"r"}`}).status; got != http.StatusGatewayTimeout {
		t.Errorf("after the waiters: %d, want 504", got)
	}
}
