package breaker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// TestPing: the guard asks the store; while its breaker is open the store counts as down even
// if it answers, because decisions skip it; pings do not move the breaker.
func TestPing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, changes := guarded(t, srv.Addr, Options{Timeout: 50 * time.Millisecond, MinCalls: 5, OpenFor: time.Hour})
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping a running Redis: %v", err)
	}
	srv.Kill()
	for range 20 {
		if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("ping a killed Redis: %v", err)
		}
	}
	if s.State() != "closed" || len(*changes) != 0 {
		t.Fatalf("pings moved the breaker: %s, changes %v", s.State(), *changes)
	}
	res := make([]algorithm.Result, 1)
	for range 10 {
		s.Apply(ctx, batch(), res)
	}
	if s.State() != "open" {
		t.Fatalf("breaker %s with Redis dead, want open", s.State())
	}
	srv.Restart(t)
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "circuit breaker open") {
		t.Fatalf("ping with the breaker open: %v, want the breaker named", err)
	}

	// A store that cannot be asked (the memory store) counts as up.
	if err := New(memory.New(), Options{}).Ping(ctx); err != nil {
		t.Fatalf("ping over the memory store: %v", err)
	}
}
