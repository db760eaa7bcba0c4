package breaker

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/store"
)

// PutLease keeps a lease in the store within the deadline, unless the breaker is open
// (store.Leaser; an error if the store keeps no leases).
func (s *Store) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return err
	}
	_, err = s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) { return false, l.PutLease(call, id, rec, ttl) })
	})
	return wrap(err)
}

// SettleLease settles a lease in the store within the deadline, unless the breaker is open.
// An unknown lease is the caller's mistake, never counted against the store.
func (s *Store) SettleLease(ctx context.Context, id []byte, used int64) (rec []byte, firstUsed int64, first bool, err error) {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return nil, 0, false, err
	}
	var unknown bool
	_, err = s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) {
			var err error
			rec, firstUsed, first, err = l.SettleLease(call, id, used)
			if err == store.ErrUnknownLease {
				unknown = true
				return false, nil
			}
			return false, err
		})
	})
	if unknown && err == nil {
		return nil, 0, false, store.ErrUnknownLease
	}
	return rec, firstUsed, first, wrap(err)
}

// Adjust settles a reservation's limits in the store within the deadline, unless the breaker
// is open.
func (s *Store) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return err
	}
	_, err = s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) { return false, l.Adjust(call, ops, at) })
	})
	return wrap(err)
}

// RenewLease renews a lease in the store within the deadline, unless the breaker is open. An
// unknown or settled lease is the caller's mistake, never counted against the store.
func (s *Store) RenewLease(ctx context.Context, id []byte, ttl time.Duration) (rec []byte, err error) {
	l, err := store.AsLeaser(s.inner)
	if err != nil {
		return nil, err
	}
	var mistake error
	_, err = s.cb.Execute(func() (bool, error) {
		return s.call(ctx, func(call context.Context) (bool, error) {
			var err error
			rec, err = l.RenewLease(call, id, ttl)
			if err == store.ErrUnknownLease || err == store.ErrLeaseSettled {
				mistake = err
				return false, nil
			}
			return false, err
		})
	})
	if mistake != nil && err == nil {
		return nil, mistake
	}
	return rec, wrap(err)
}
