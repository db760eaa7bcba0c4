package redis

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/store"
)

// Ping asks Redis for a PONG within the store's deadline, for readiness probes. On a Cluster
// the client sends it to one node of its choosing.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.client.Do(ctx, s.client.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("%w: redis ping: %w", store.ErrUnavailable, err)
	}
	return nil
}
