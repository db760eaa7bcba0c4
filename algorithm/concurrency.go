package algorithm

import (
	"errors"
	"math"
)

// ErrNoSlot is returned by Slots.Renew and Slots.Release for a lease id the set does not hold
// (never acquired, already settled, or expired).
var ErrNoSlot = errors.New("algorithm: no slot held by that lease")

// Slot is one lease in flight on a concurrency key: its id and the instant (µs) it returns
// by itself if nobody settles or renews it.
type Slot struct {
	ID     string
	Expiry int64
}

// Slots is the state of a concurrency key: the leases in flight, in no order. A slot counts
// while now < Expiry and returns at its Expiry exactly (not before, not never). The zero
// Slots is a key with every slot free. It is the model the Redis ZSET (lease ids scored by
// expiry) must match.
type Slots struct {
	In []Slot
}

// expiryAt returns now+ttl, saturated at math.MaxInt64 so a huge ttl holds the slot
// (until settled) instead of wrapping negative and freeing it at once. A ttl of zero or
// less expires at now, which holds nothing.
func expiryAt(now, ttl int64) int64 {
	if ttl <= 0 {
		return now
	}
	if ttl > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + ttl
}

// expire drops the slots whose expiry is at or before now.
func (s *Slots) expire(now int64) {
	live := s.In[:0]
	for _, sl := range s.In {
		if sl.Expiry > now {
			live = append(live, sl)
		}
	}
	clear(s.In[len(live):])
	s.In = live
}

// InFlight returns the number of slots held at now, dropping the expired ones.
func (s *Slots) InFlight(now int64) int64 {
	s.expire(now)
	return int64(len(s.In))
}

// Acquire takes a slot for id until now+ttl when fewer than limit are in flight at now and
// reports whether it did. A ttl of zero or less takes nothing and reports false. An id already holding a slot keeps it and has its expiry set to
// now+ttl (a retried acquire takes no second slot).
func (s *Slots) Acquire(id string, now, ttl, limit int64) bool {
	s.expire(now)
	if ttl <= 0 {
		return false
	}
	for i := range s.In {
		if s.In[i].ID == id {
			s.In[i].Expiry = expiryAt(now, ttl)
			return true
		}
	}
	if int64(len(s.In)) >= limit {
		return false
	}
	s.In = append(s.In, Slot{ID: id, Expiry: expiryAt(now, ttl)})
	return true
}

// Renew sets the expiry of id's slot to now+ttl; ErrNoSlot when id holds none at now.
func (s *Slots) Renew(id string, now, ttl int64) error {
	s.expire(now)
	for i := range s.In {
		if s.In[i].ID == id {
			s.In[i].Expiry = expiryAt(now, ttl)
			return nil
		}
	}
	return ErrNoSlot
}

// Release frees id's slot; ErrNoSlot when id holds none at now.
func (s *Slots) Release(id string, now int64) error {
	s.expire(now)
	for i := range s.In {
		if s.In[i].ID == id {
			last := len(s.In) - 1
			s.In[i] = s.In[last]
			s.In[last] = Slot{}
			s.In = s.In[:last]
			return nil
		}
	}
	return ErrNoSlot
}
