package httplimit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/store/breaker"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// guarded connects to a real Redis and guards it as `sluice serve` does. The deadline is
// generous so that a loaded test machine does not fail the calls made while Redis is up.
func guarded(t *testing.T, srv *redistest.Server) sluice.Store {
	t.Helper()
	st, err := redis.New(context.Background(), "redis://"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return breaker.New(st, breaker.Options{Timeout: 200 * time.Millisecond})
}

// TestStoreOutage kills a real Redis under the middleware: each rule's on_store_error decides
// (open passes, closed denies with the decision, local limits in process), and when even the
// fallback fails the request is refused with 503, not let through.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	spare := redistest.Start(t) // a fallback store that fails as well
	snap := testutil.Snapshot(t, `
rules:
  - {name: open, match: {endpoint: /open}, key: [ip], algorithm: fixed_window, limit: 1, period: 1h, on_store_error: open}
  - {name: closed, match: {endpoint: /closed}, key: [ip], algorithm: fixed_window, limit: 1, period: 1h, on_store_error: closed}
  - {name: local, match: {endpoint: /local}, key: [ip], algorithm: fixed_window, limit: 2, period: 1h, on_store_error: local}
`)
	withMemory, err := sluice.New(guarded(t, srv), snap, sluice.WithFallback(memory.New(memory.WithSweepInterval(0))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { withMemory.Close() })
	withDeadFallback, err := sluice.New(guarded(t, srv), snap, sluice.WithFallback(guarded(t, spare)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { withDeadFallback.Close() })

	n := &next{}
	h := httplimit.New(withMemory).Handler(n)
	if w := get(h, "/closed", "192.0.2.1:1", nil); w.Code != 200 {
		t.Fatalf("with Redis up: %d %s", w.Code, w.Body.String())
	}
	srv.Kill()
	spare.Kill()

	cases := []struct {
		name     string
		lim      *sluice.Limiter
		path     string
		statuses string // of three requests from one peer
	}{
		{"on_store_error open: passes", withMemory, "/open", "[200 200 200]"},
		{"on_store_error closed: denied with the decision", withMemory, "/closed", "[429 429 429]"},
		{"on_store_error local: the fallback limits", withMemory, "/local", "[200 200 429]"},
		{"fallback down too: 503", withDeadFallback, "/local", "[503 503 503]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := &next{}
			h := httplimit.New(c.lim).Handler(n)
			var codes []int
			var passed int64
			for range 3 {
				w := get(h, c.path, "192.0.2.1:1", nil)
				codes = append(codes, w.Code)
				if w.Code == 200 {
					passed++
				}
				switch w.Code {
				case 429:
					var d struct {
						Degraded bool
						Reason   string
					}
					if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil || !d.Degraded {
						t.Errorf("429 body %s (%v): want degraded", w.Body.String(), err)
					}
					if c.path == "/closed" && !strings.Contains(d.Reason, "on_store_error") {
						t.Errorf("429 reason %q: want it to name on_store_error", d.Reason)
					}
				case 503:
					if !strings.Contains(w.Body.String(), `"error"`) || strings.Contains(w.Body.String(), srv.Addr) {
						t.Errorf("503 body %s: want an error that does not reveal the store", w.Body.String())
					}
				}
			}
			if fmt.Sprint(codes) != c.statuses || n.calls.Load() != passed {
				t.Errorf("statuses %v (%d reached the handler), want %s", codes, n.calls.Load(), c.statuses)
			}
		})
	}
}
