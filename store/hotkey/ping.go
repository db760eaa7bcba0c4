package hotkey

import (
	"context"

	"github.com/sluicehq/sluice/store"
)

// Ping asks the shared store, if it can be asked: hot keys decided here do not make the node
// ready while the store is down.
func (s *Store) Ping(ctx context.Context) error { return store.Ping(ctx, s.inner) }
