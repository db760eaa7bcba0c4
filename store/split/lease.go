package split

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/store"
)

// PutLease keeps a lease in the long store (store.Leaser).
func (s *Store) PutLease(ctx context.Context, id, rec []byte, ttl time.Duration) error {
	l, err := store.AsLeaser(s.long)
	if err != nil {
		return err
	}
	return l.PutLease(ctx, id, rec, ttl)
}

// SettleLease settles a lease in the long store (store.Leaser).
func (s *Store) SettleLease(ctx context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	l, err := store.AsLeaser(s.long)
	if err != nil {
		return nil, 0, false, err
	}
	return l.SettleLease(ctx, id, used)
}

// Adjust settles each op in the store its period sends it to (store.Leaser).
func (s *Store) Adjust(ctx context.Context, ops []store.Op, at []int64) error {
	var shortOps, longOps []store.Op
	var shortAt, longAt []int64
	for i := range ops {
		if s.isShort(&ops[i]) {
			shortOps, shortAt = append(shortOps, ops[i]), append(shortAt, at[i])
		} else {
			longOps, longAt = append(longOps, ops[i]), append(longAt, at[i])
		}
	}
	var errs []error
	for _, part := range []struct {
		st  store.Store
		ops []store.Op
		at  []int64
	}{{s.short, shortOps, shortAt}, {s.long, longOps, longAt}} {
		if len(part.ops) == 0 {
			continue
		}
		l, err := store.AsLeaser(part.st)
		if err == nil {
			err = l.Adjust(ctx, part.ops, part.at)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RenewLease passes to the store that keeps leases (store.Leaser).
func (s *Store) RenewLease(ctx context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	l, err := store.AsLeaser(s.long)
	if err != nil {
		return nil, err
	}
	return l.RenewLease(ctx, id, ttl)
}
