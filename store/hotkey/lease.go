package hotkey

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/store"
)

// PutLease keeps a lease in the shared store (store.Leaser).
func (s *Store) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return err
	}
	return l.PutLease(ctx, id, rec, ttl)
}

// SettleLease settles a lease in the shared store (store.Leaser).
func (s *Store) SettleLease(ctx context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return nil, 0, false, err
	}
	return l.SettleLease(ctx, id, used)
}

// Adjust settles a reservation in the shared store, which decided it (reservations bypass
// hot-key mode: Batch.Lease).
func (s *Store) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return err
	}
	return l.Adjust(ctx, ops, at)
}

// RenewLease passes to the store that keeps leases (store.Leaser).
func (s *Store) RenewLease(ctx context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return nil, err
	}
	return l.RenewLease(ctx, id, ttl)
}
