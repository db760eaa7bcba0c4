package algorithm

import "math"

// Slot is one lease in flight on a concurrency key: its lease id and the instant (µs) it
// returns by itself if nobody settles or renews it.
type Slot struct {
	ID     string
	Expiry int64
}

// A concurrency limit (Concurrency) holds its leases in flight in s.Log.Slots, in no order.
// A slot counts while now < Expiry and returns at its Expiry exactly: not before, and not
// never, whatever happens to its holder. Nothing refills with time. It is the model the Redis
// store's sorted set (lease ids scored by expiry) matches.
//
// Decide brings the slots up to now (the expired ones dropped, in place: the caller gives it
// a state of its own) and decides whether a slot is free; TakeSlot takes it for a lease.
// Commit takes nothing for a concurrency limit: a slot needs a lease to name it, and a check
// without one only asks whether a slot is free.

// maxSlotWait bounds what a concurrency result reports as a wait: a slot saturated at
// math.MaxInt64 (a hostile ttl) would overflow a duration.
const maxSlotWait = int64(MaxPeriod / 1000)

// slotExpiry returns now+ttl, saturated at math.MaxInt64 so a huge ttl holds the slot (until
// settled) instead of wrapping negative and freeing it at once. A ttl of zero or less expires
// at now, which holds nothing.
func slotExpiry(now, ttl int64) int64 {
	if ttl <= 0 {
		return now
	}
	if ttl > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + ttl
}

// expireSlots drops the slots whose expiry is at or before now and returns how many are left.
func expireSlots(s *State, now int64) int64 {
	if s.Log == nil {
		return 0
	}
	live := s.Log.Slots[:0]
	for _, sl := range s.Log.Slots {
		if sl.Expiry > now {
			live = append(live, sl)
		}
	}
	clear(s.Log.Slots[len(live):])
	s.Log.Slots = live
	return int64(len(live))
}

// concurrency decides a request for one slot (any cost > 0 asks for one; 0 looks).
func (p *Params) concurrency(s *State, now, cost int64, r *Result) {
	n := expireSlots(s, now)
	switch {
	case cost == 0:
		r.Allowed = true
	case p.Limit == 0:
		r.Reason = ReasonCostExceedsCapacity
	case n < p.Limit:
		r.Allowed = true
		n++
	}
	r.Remaining = max(0, p.Limit-n)
	if s.Log == nil || len(s.Log.Slots) == 0 {
		return
	}
	first, last := int64(math.MaxInt64), int64(0)
	for _, sl := range s.Log.Slots {
		first, last = min(first, sl.Expiry), max(last, sl.Expiry)
	}
	r.ResetAfter = min(last-now, maxSlotWait)
	if !r.Allowed && r.Reason == ReasonNone {
		// The latest a slot comes back: its holder may release it sooner.
		r.RetryAfter = min(first-now, maxSlotWait)
	}
}

// TakeSlot takes a slot for lease id until now+ttl on s, which Decide brought up to now and
// found a slot free in, and returns the instant after which s is as good as fresh (its last
// slot's expiry). An id that already holds a slot keeps it, its expiry set to now+ttl: a
// retried acquire takes no second slot.
func TakeSlot(s *State, now int64, id string, ttl int64) (idleAt int64) {
	if s.Log == nil {
		s.Log = &Log{}
	}
	found := false
	for i := range s.Log.Slots {
		if s.Log.Slots[i].ID == id {
			s.Log.Slots[i].Expiry, found = slotExpiry(now, ttl), true
		}
	}
	if !found {
		s.Log.Slots = append(s.Log.Slots, Slot{ID: id, Expiry: slotExpiry(now, ttl)})
	}
	return lastExpiry(s)
}

// SettleSlot settles lease id's slot on s at now: ttl > 0 renews it to now+ttl, else it is
// freed. It reports whether id held a slot (an expired, freed or never taken one holds none)
// and the instant after which s is as good as fresh.
func SettleSlot(s *State, now int64, id string, ttl int64) (idleAt int64, held bool) {
	expireSlots(s, now)
	if s.Log == nil {
		return 0, false
	}
	for i := range s.Log.Slots {
		if s.Log.Slots[i].ID != id {
			continue
		}
		if ttl > 0 {
			s.Log.Slots[i].Expiry = slotExpiry(now, ttl)
		} else {
			last := len(s.Log.Slots) - 1
			s.Log.Slots[i] = s.Log.Slots[last]
			s.Log.Slots[last] = Slot{}
			s.Log.Slots = s.Log.Slots[:last]
		}
		return lastExpiry(s), true
	}
	return 0, false
}

// InFlight returns the number of slots held on s at now, dropping the expired ones.
func InFlight(s *State, now int64) int64 { return expireSlots(s, now) }

func lastExpiry(s *State) int64 {
	var last int64
	for _, sl := range s.Log.Slots {
		last = max(last, sl.Expiry)
	}
	return last
}
