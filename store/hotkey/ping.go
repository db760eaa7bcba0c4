package hotkey

import "context"

// pinger is a store that can tell whether it answers (the Redis store can).
type pinger interface {
	Ping(ctx context.Context) error
}

// Ping asks the shared store, if it can be asked: hot keys decided here do not make the node
// ready while the store is down.
func (s *Store) Ping(ctx context.Context) error {
	if p, ok := s.inner.(pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}
