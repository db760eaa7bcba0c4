package algorithm

// Adjust settles a reservation of cost units that a limit consumed at instant at (µs): delta
// > 0 gives delta units back, delta < 0 takes -delta more even past the limit (the work is
// done; later requests wait). It first brings s up to now, as Decide does, and reports whether
// it changed s, and the instant after which s is as good as fresh (0 when giving back: that
// never makes a key live longer than its last commit asked).
//
// Giving back follows each algorithm (docs/architecture.md, Reservations): tokens back, capped
// at the burst; a bucket's level or a GCRA's debt down, never below empty; a window's count
// down only while now is still in the window at fell in; a log's entry at at reduced or
// removed; a counter's bucket that holds at's tick reduced or removed. What has left the
// window in between is not given back: it no longer counts anyway.
//
// Taking more is capped at the limit's capacity per settlement, so that a limit is at most
// twice its capacity in debt and every product stays exact (see NewParams).
func Adjust(p *Params, s *State, now, at, delta int64) (idleAt int64, changed bool) {
	var r Result
	decide(p, s, now, 0, &r) // refill, leak, roll and prune up to now
	if delta < 0 {
		if p.Limit == 0 {
			return 0, false // nothing was consumed, nothing can be
		}
		return Commit(p, s, now, min(-delta, p.Capacity())), true
	}
	if delta == 0 {
		return 0, false
	}
	delta = min(delta, p.Capacity()) // a reservation took at most this much
	switch p.Kind {
	case TokenBucket:
		if s.V >= p.capacity {
			return 0, false
		}
		s.V = min(p.capacity, s.V+delta*p.scale)
	case LeakyBucket:
		if s.V <= 0 {
			return 0, false
		}
		s.V = max(0, s.V-delta*p.scale)
	case GCRA:
		nowT := p.ticks(now)
		debt := p.gcraDebt(s, nowT)
		if debt <= 0 || p.rate == 0 {
			return 0, false
		}
		debt = max(0, debt-delta*p.scale)
		s.T, s.V = nowT+debt/p.rate, debt%p.rate
	case FixedWindow:
		start, _ := p.fixedBounds(now)
		if atStart, _ := p.fixedBounds(at); atStart != start || s.T != start || s.V <= 0 {
			return 0, false
		}
		s.V = max(0, s.V-delta)
	case SlidingWindowLog:
		return 0, p.logGiveBack(s, at, delta)
	case SlidingWindowCounter:
		return 0, p.counterGiveBack(s, now, at, delta)
	default:
		return 0, false
	}
	return 0, true
}

// logGiveBack reduces the log's entry at at by up to delta, removing it when nothing is left.
// Decide pruned the log to the window, so an entry that left it is not found.
func (p *Params) logGiveBack(s *State, at, delta int64) bool {
	if s.Log == nil {
		return false
	}
	es := s.Log.Entries
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].At != at {
			continue
		}
		back := min(es[i].Cost, delta)
		s.V -= back
		if back < es[i].Cost {
			es[i].Cost -= back
			return true
		}
		// A new array: the store's stored log may share this one (store/memory's working
		// copy has its own header, not its own entries).
		out := make([]Entry, 0, len(es)-1)
		out = append(out, es[:i]...)
		s.Log.Entries = append(out, es[i+1:]...)
		return true
	}
	return false
}

// counterGiveBack reduces the counter's live bucket whose span holds at's tick by up to delta
// (the newest such bucket, removing it when nothing is left), and the window count T, V, W
// keeps for the region sync when at is in its current or previous window.
func (p *Params) counterGiveBack(s *State, now, at, delta int64) bool {
	if s.Log == nil || len(s.Log.Buckets) == 0 || s.Log.TickExp != p.tickExp {
		return false // another tick since: the buckets are converted by the next commit
	}
	atT := p.ticks(at)
	from := p.ticks(now) - p.periodTicks
	bs := s.Log.Buckets
	for i := len(bs) - 1; i >= 0; i-- {
		b := &bs[i]
		if b.Last <= from || atT < b.First || atT > b.Last {
			continue
		}
		back := min(b.Count, delta)
		switch start := p.window(at); {
		case s.T == start:
			s.V = max(0, s.V-back)
		case s.T == start+p.Period:
			s.W = max(0, s.W-back)
		}
		if back < b.Count {
			b.Count -= back
			return true
		}
		nb := make([]Bucket, 0, CounterSlots)
		nb = append(nb, bs[:i]...)
		nb = append(nb, bs[i+1:]...)
		s.Log.SetBuckets(nb, s.Log.TickExp)
		return true
	}
	return false
}
