package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
)

// TestPing: a running Redis answers; a killed one is ErrUnavailable; a restarted one answers
// again without a new Store.
func TestPing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := New(ctx, "redis://"+srv.Addr, WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("ping a running Redis: %v", err)
	}
	srv.Kill()
	if err := st.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping a killed Redis: %v, want ErrUnavailable", err)
	}
	srv.Restart(t)
	waitFor(t, func() error { return st.Ping(ctx) })
}

// waitFor retries f until it succeeds, failing the test after a generous 30 s.
func waitFor(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after 30 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
