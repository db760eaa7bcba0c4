package breaker

import (
	"context"
	"fmt"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice/store"
)

// Ping reports the store unavailable while the breaker is open, since decisions skip the store
// then, and otherwise asks the store, if it can be asked. A ping is not traffic: it neither
// counts toward opening the breaker nor serves as a half-open probe.
func (s *Store) Ping(ctx context.Context) error {
	if s.cb.State() == gobreaker.StateOpen {
		return fmt.Errorf("%w: circuit breaker open", store.ErrUnavailable)
	}
	return store.Ping(ctx, s.inner)
}
