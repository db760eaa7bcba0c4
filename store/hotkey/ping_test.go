package hotkey

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// TestPing: hot-key mode asks the shared store; a store that cannot be asked counts as up.
func TestPing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	inner, err := redis.New(ctx, "redis://"+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	s := New(inner, Options{})
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping a running Redis: %v", err)
	}
	srv.Kill()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping a killed Redis: %v, want ErrUnavailable", err)
	}
	m := New(memory.New(), Options{})
	defer m.Close()
	if err := m.Ping(ctx); err != nil {
		t.Fatalf("ping over the memory store: %v", err)
	}
}
