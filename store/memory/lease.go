package memory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// leases holds reservations' lease records (store.Leaser), apart from the bucket stripes: a
// settlement is rare beside checks, and one lock keeps it simple.
type leases struct {
	mu sync.Mutex
	m  map[string]*leaseRecord
}

// leaseRecord is one lease: the caller's record, when it expires (µs), and its settlement.
type leaseRecord struct {
	rec     []byte
	until   int64
	settled bool
	used    int64
}

// PutLease keeps rec under id until ttl has passed (store.Leaser).
func (s *Store) PutLease(_ context.Context, id, rec []byte, ttl time.Duration) error {
	now := s.clock()
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	if s.leases.m == nil {
		s.leases.m = map[string]*leaseRecord{}
	}
	s.leases.m[string(id)] = &leaseRecord{rec: append([]byte(nil), rec...), until: now + ttl.Microseconds()}
	return nil
}

// SettleLease settles the lease id once (store.Leaser).
func (s *Store) SettleLease(_ context.Context, id []byte, used int64) ([]byte, int64, bool, error) {
	now := s.clock()
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	l := s.leases.m[string(id)]
	if l == nil || l.until <= now {
		return nil, 0, false, store.ErrUnknownLease
	}
	if l.settled {
		return l.rec, l.used, false, nil
	}
	l.settled, l.used = true, used
	return l.rec, used, true, nil
}

// RenewLease sets an unsettled lease's expiry to ttl from now (store.Leaser).
func (s *Store) RenewLease(_ context.Context, id []byte, ttl time.Duration) ([]byte, error) {
	now := s.clock()
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	l := s.leases.m[string(id)]
	switch {
	case l == nil || l.until <= now:
		return nil, store.ErrUnknownLease
	case l.settled:
		return nil, store.ErrLeaseSettled
	}
	l.until = now + ttl.Microseconds()
	return l.rec, nil
}

// LiveLeases returns how many leases the store holds that have not expired, settled or not.
func (s *Store) LiveLeases() int {
	now := s.clock()
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	n := 0
	for _, l := range s.leases.m {
		if l.until > now {
			n++
		}
	}
	return n
}

// sweepLeases drops the records of expired leases.
func (s *Store) sweepLeases(now int64) {
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	for k, l := range s.leases.m {
		if l.until <= now {
			delete(s.leases.m, k)
		}
	}
}

// Adjust settles a reservation on its limits (store.Leaser), all ops at one instant under
// their keys' locks, as a batch.
func (s *Store) Adjust(_ context.Context, ops []store.Op, at []int64) error {
	if len(ops) == 0 {
		return nil
	}
	if len(at) != len(ops) {
		return fmt.Errorf("adjust: %d instants for %d ops", len(at), len(ops))
	}
	now := s.clock()
	ps := make([]pending, len(ops))
	for i := range ops {
		ps[i].hash = s.hashOf(ops[i].Key)
		ps[i].shard, ps[i].alias = int(ps[i].hash%numShards), -1
	}
	// acquire creates entries only for ops that cost something; a give-back to a key the
	// store no longer holds has nothing to give back to, so only takes create.
	take := make([]store.Op, len(ops))
	copy(take, ops)
	for i := range take {
		take[i].Cost = max(0, -ops[i].Cost)
	}
	s.acquire(take, ps, now)
	defer release(ps)
	changed := false
	for i := range ops {
		p := &ps[i]
		root := p
		if p.alias >= 0 {
			root = &ps[p.alias]
		}
		if root.e == nil {
			continue
		}
		var idle int64
		var ok bool
		if ops[i].Params.Kind == algorithm.Concurrency {
			idle, ok = algorithm.SettleSlot(stateOf(ps, i), now, string(ops[i].Slot), ops[i].SlotTTL)
		} else {
			idle, ok = algorithm.Adjust(ops[i].Params, stateOf(ps, i), now, at[i], ops[i].Cost)
		}
		if ok {
			root.dirty, root.idleAt = true, max(root.idleAt, idle)
		}
	}
	for i := range ops {
		p := &ps[i]
		if p.alias >= 0 || !p.dirty {
			continue
		}
		changed = true
		p.e.save(&p.st, p.idleAt)
	}
	if changed {
		s.markChanged()
	}
	return nil
}
