package algorithm

// State is the stored state of one bucket key. Its meaning depends on the algorithm:
//
//	token_bucket           T = last refill (ticks), V = tokens (1/scale units), W = fingerprint
//	gcra                   T = TAT (whole ticks),   V = TAT fraction (1/rate tick), W = fingerprint
//	leaky_bucket           T = last leak (ticks),   V = level (1/scale units), W = fingerprint
//	fixed_window           T = window start (µs),   V = count
//	sliding_window_counter T = window start (µs),   V = current count, W = previous count,
//	                       Log = buckets of the admissions in the last period (what it decides on)
//	sliding_window_log     V = sum of Log costs,    Log = entries in (now-P, now]
//	concurrency            Log.Slots = the leases in flight (see TakeSlot)
//
// The zero State is a fresh key: a full bucket or an empty window. A sliding_window_counter keeps
// T, V and W, which it no longer decides on, for the region sync (store.StateReader).
type State struct {
	T, V, W int64
	Log     *Log
}

// Log holds the entries of a sliding_window_log key, oldest first, at most one per microsecond,
// or the buckets of a sliding_window_counter key.
type Log struct {
	Entries []Entry
	// Buckets are a sliding_window_counter's admissions, oldest first, at most CounterSlots
	// of them, their ticks counted in 10^TickExp µs.
	Buckets []Bucket
	TickExp int64
	arrays  bucketArrays
	// Slots are a concurrency key's leases in flight.
	Slots []Slot
}

// bucketArrays are the arrays of CounterSlots buckets a counter's Buckets lie in. Commit prunes
// by reslicing from the front; when the live buckets reach the end of their array, it moves
// them to the start of one: their own when no Undo may restore a view of it, else the spare
// one (arrays alternate under batches), else a new one.
type bucketArrays struct {
	base  []Bucket // the array Buckets lie in, from its start, empty
	spare []Bucket // another, or nil
	// pinned and pinned2 identify (arrayEnd) the arrays of the views the running batch's
	// last two Undos saved, which Commit must not write into; nil when none is running.
	pinned, pinned2 *Bucket
}

// arrayEnd identifies the array a bucket slice lies in by its last element: the counter's
// slices are all reslices of arrays of CounterSlots made whole.
func arrayEnd(bs []Bucket) *Bucket {
	if cap(bs) == 0 {
		return nil
	}
	return &bs[:cap(bs)][cap(bs)-1]
}

// SetBuckets makes bs, of capacity CounterSlots, the counter's buckets, counted in ticks of
// 10^tickExp µs (a snapshot being read).
func (lg *Log) SetBuckets(bs []Bucket, tickExp int64) {
	lg.Buckets, lg.TickExp, lg.arrays = bs, tickExp, bucketArrays{base: bs[:0]}
}

// ClearCounter empties a sliding_window_counter's buckets and keeps their array for the next
// ones: a store that reuses lg for its key gone idle allocates nothing. Nothing else may hold
// lg (no Undo of a running batch).
func (lg *Log) ClearCounter() {
	lg.Buckets, lg.TickExp = lg.arrays.base[:0], 0
	lg.arrays.pinned, lg.arrays.pinned2 = nil, nil
}

// Unpin tells lg that no Undo saved from it will be restored any more (the batch is over):
// Commit may then move buckets back into the array the last one saved a view of, instead of
// allocating another.
func (lg *Log) Unpin() { lg.arrays.pinned, lg.arrays.pinned2 = nil, nil }

// Bucket is a run of a sliding_window_counter's admissions: Count units admitted from tick First
// to tick Last, both included. A bucket is closed once it holds about Limit/CounterBuckets, so
// the one bucket a window's start cuts, whose units it can only estimate, errs by less than
// that (docs/architecture.md, Windows).
type Bucket struct {
	First, Last, Count int64
}

// CounterBuckets is how many buckets a sliding_window_counter splits its limit into: the
// estimate errs by under Limit/CounterBuckets. CounterSlots is how many it keeps at most;
// beyond, the two adjacent buckets with the least between them are merged.
const (
	CounterBuckets = 20
	CounterSlots   = CounterBuckets + 2
)

// Entry is one admitted request of a sliding_window_log: its time (µs) and cost.
type Entry struct {
	At, Cost int64
}

// Reason says why a request was denied when waiting would not help.
type Reason uint8

const (
	// ReasonNone is a plain decision: allowed, or denied until RetryAfter.
	ReasonNone Reason = iota
	// ReasonCostExceedsCapacity denies a request that costs more than the limit can ever admit.
	ReasonCostExceedsCapacity
)

// String describes r for a decision's reason field.
func (r Reason) String() string {
	if r == ReasonCostExceedsCapacity {
		return "cost exceeds the limit's capacity"
	}
	return ""
}

// Result is what one limit decides for one request. Durations are microseconds from now.
type Result struct {
	Allowed    bool
	Reason     Reason
	Remaining  int64 // what could still be spent now, after this request if it is allowed
	ResetAfter int64 // until the limit is fully restored
	RetryAfter int64 // until the same request would be allowed; 0 when allowed or never
	Delay      int64 // leaky_bucket: the request's place in the queue
}

// Decide brings s up to now, which changes no decision (refill, leak, window roll, pruning),
// and reports what consuming cost would give. It consumes nothing: Commit does. A cost of 0
// looks without consuming and is always allowed.
func Decide(p *Params, s *State, now, cost int64) Result {
	var r Result
	decide(p, s, now, cost, &r)
	return r
}

// DecideInto is Decide writing to r, for the hot path: a Result returned by value is built on
// the stack and copied, and the copy stalls on store forwarding.
func DecideInto(p *Params, s *State, now, cost int64, r *Result) { decide(p, s, now, cost, r) }

func decide(p *Params, s *State, now, cost int64, r *Result) {
	*r = Result{}
	switch p.Kind {
	case TokenBucket:
		nowT := p.refill(s, now)
		p.bucketResult(s.V, cost, nowT, now, r)
	case GCRA:
		nowT := p.gcraNormalize(s, now)
		p.bucketResult(p.capacity-p.gcraDebt(s, nowT), cost, nowT, now, r)
	case LeakyBucket:
		nowT := p.leak(s, now)
		p.bucketResult(p.capacity-s.V, cost, nowT, now, r)
		if r.Allowed && cost > 0 && s.V > 0 {
			r.Delay = p.after(nowT, ceilDiv(s.V, p.rate), now)
		}
	case FixedWindow:
		if p.cal != nil {
			start, end := p.cal.Window(now)
			p.fixedWindow(s, start, end, now, cost, r)
		} else {
			start := p.window(now)
			p.fixedWindow(s, start, start+p.Period, now, cost, r)
		}
	case SlidingWindowCounter:
		p.slidingCounter(s, now, cost, r)
	case SlidingWindowLog:
		p.slidingLog(s, now, cost, r)
	case Concurrency:
		p.concurrency(s, now, cost, r)
	}
}

// Commit consumes cost from s, which Decide brought up to the same now and found allowed. It
// returns the instant (µs) after which s is as good as fresh and may be dropped.
func Commit(p *Params, s *State, now, cost int64) (idleAt int64) {
	switch p.Kind {
	case TokenBucket:
		s.V -= cost * p.scale
		return p.ticksAt(s.T + ceilDiv(p.capacity-s.V, max(p.rate, 1)))
	case GCRA:
		// Decide left TAT >= now, so the debt is exact; cost <= Burst implies rate > 0.
		nowT := now / p.tick
		debt := p.gcraDebt(s, nowT) + cost*p.scale
		s.T, s.V = nowT+debt/p.rate, debt%p.rate
		return p.ticksAt(s.T + 1)
	case LeakyBucket:
		s.V += cost * p.scale
		return p.ticksAt(s.T + ceilDiv(s.V, max(p.rate, 1)))
	case FixedWindow:
		s.V += cost
		if p.cal != nil {
			_, end := p.cal.Window(now)
			return end
		}
		return s.T + p.Period
	case SlidingWindowCounter:
		s.V += cost
		p.addBucket(s, now, cost)
		return s.T + 2*p.Period
	case SlidingWindowLog:
		if s.Log == nil {
			s.Log = &Log{}
		}
		if n := len(s.Log.Entries); n > 0 && s.Log.Entries[n-1].At == now {
			s.Log.Entries[n-1].Cost += cost
		} else {
			s.Log.Entries = append(s.Log.Entries, Entry{At: now, Cost: cost})
		}
		s.V += cost
		return now + p.Period
	}
	return now
}

// Drain empties what is left of the limit in s, which Decide brought up to the same now and
// found denied (on_deny: drain; Params.WithDrain): the buckets are left empty, a fixed window
// counted full, a log given an entry at now of what it had left. It returns the instant after
// which s is as good as fresh. A store drains only a binding limit that denied a request
// waiting could admit (Reason none), after the batch's commits were undone.
func Drain(p *Params, s *State, now int64) (idleAt int64) {
	switch p.Kind {
	case TokenBucket:
		s.V = 0
		return p.ticksAt(s.T + ceilDiv(p.capacity, max(p.rate, 1)))
	case GCRA:
		if p.rate == 0 {
			return now
		}
		nowT := p.ticks(now)
		s.T, s.V = nowT+p.capacity/p.rate, p.capacity%p.rate
		return p.ticksAt(s.T + 1)
	case LeakyBucket:
		s.V = p.capacity
		return p.ticksAt(s.T + ceilDiv(s.V, max(p.rate, 1)))
	case FixedWindow, SlidingWindowLog:
		if left := p.Limit - s.V; left > 0 {
			return Commit(p, s, now, left)
		}
		if p.Kind == FixedWindow {
			_, end := p.fixedBounds(now)
			return end
		}
		if s.Log != nil && len(s.Log.Entries) > 0 {
			return s.Log.Entries[len(s.Log.Entries)-1].At + p.Period
		}
	}
	return now
}

// Take is Decide followed, when the request is allowed and costs something, by Commit, with
// the result written to r: what a store does for a limit that no sibling can deny. committed
// reports whether it consumed.
func Take(p *Params, s *State, now, cost int64, r *Result) (idleAt int64, committed bool) {
	decide(p, s, now, cost, r)
	if !r.Allowed || cost == 0 {
		return 0, false
	}
	if p.Kind == TokenBucket {
		// Commit's idle instant is the end of the refill just reported; an allowed cost leaves
		// the bucket short by at least one sub-unit, so that end is after now.
		s.V -= cost * p.scale
		return now + r.ResetAfter, true
	}
	return Commit(p, s, now, cost), true
}

// Undo remembers a State before Commit so that a batch whose sibling limit denies can put it back.
type Undo struct {
	slots      []Slot
	state      State
	entries    []Entry
	last       Entry
	buckets    []Bucket
	lastBucket Bucket
	tickExp    int64
	arrays     bucketArrays
}

// Save records in u what Restore needs to undo the next Commit on s. It fills u in place: an
// Undo returned by value was built on the stack and copied (docs/measurements.md).
func (u *Undo) Save(s *State) {
	u.state, u.entries, u.last, u.buckets, u.lastBucket = *s, nil, Entry{}, nil, Bucket{}
	if s.Log != nil {
		u.entries = s.Log.Entries
		if n := len(u.entries); n > 0 {
			u.last = u.entries[n-1]
		}
		u.buckets, u.tickExp, u.arrays, u.slots = s.Log.Buckets, s.Log.TickExp, s.Log.arrays, s.Log.Slots
		if n := len(u.buckets); n > 0 {
			u.lastBucket = u.buckets[n-1]
		}
		if a := &s.Log.arrays; arrayEnd(u.buckets) != nil && arrayEnd(u.buckets) != a.pinned {
			a.pinned2, a.pinned = a.pinned, arrayEnd(u.buckets)
		}
	}
}

// Restore puts s back as it was when u was saved.
func (u *Undo) Restore(s *State) {
	log := s.Log
	*s = u.state
	if u.state.Log == nil {
		return
	}
	// Commit may have merged into the last entry in place; the append case left the saved
	// prefix untouched.
	log.Entries = u.entries
	if n := len(u.entries); n > 0 {
		log.Entries[n-1] = u.last
	}
	// Likewise for a counter's buckets: Commit merges into the last one in place, and appends
	// or rebuilds beyond what the saved slice sees.
	// TakeSlot appends beyond what the saved slice sees, or rewrites the expiry of a retried id.
	log.Slots = u.slots
	cur := log.arrays
	log.Buckets, log.TickExp, log.arrays = u.buckets, u.tickExp, u.arrays
	if cap(log.arrays.spare) == 0 {
		// Keep an array the undone commit moved the buckets into as the spare: no view an
		// Undo still holds lies in it, and the next batch would only allocate it again.
		if arrayEnd(cur.base) != arrayEnd(u.arrays.base) {
			log.arrays.spare = cur.base
		} else {
			log.arrays.spare = cur.spare
		}
	}
	if n := len(u.buckets); n > 0 {
		log.Buckets[n-1] = u.lastBucket
	}
}

// after is the time in µs from now until tick nowT+k begins, never negative.
func (p *Params) after(nowT, k, now int64) int64 {
	return max(0, (nowT+k)*p.tick-now)
}

func (p *Params) ticksAt(t int64) int64 { return t * p.tick }

// bucketResult decides a request of cost against avail sub-units of a bucket of capacity
// p.capacity that refills p.rate sub-units per tick. It is the one decision the three bucket
// encodings share, which is why they decide identically.
func (p *Params) bucketResult(avail, cost, nowT, now int64, r *Result) {
	if cost > p.Burst {
		r.Reason = ReasonCostExceedsCapacity
		cost = 0 // cost*scale could overflow; nothing is consumed anyway
	}
	inc := cost * p.scale
	switch {
	case r.Reason != ReasonNone:
	case inc <= avail || cost == 0: // a look is always allowed, even over a lowered limit
		r.Allowed = true
		avail -= inc
	default:
		r.RetryAfter = p.after(nowT, ceilDiv(inc-avail, p.rate), now)
	}
	if p.rate > 0 {
		r.ResetAfter = p.after(nowT, ceilDiv(p.capacity-avail, p.rate), now)
	}
	r.Remaining = max(0, avail)
	if p.scale != 1 {
		r.Remaining /= p.scale
	}
}

// convert rewrites bucket state written under another fingerprint (the limit changed) into the
// units of p, rounding against the caller. It reports whether s held state at all.
func (p *Params) convert(s *State, nowT int64) bool {
	if s.W == 0 {
		return false
	}
	oldUnit, oldExp := s.W>>3, s.W&7
	toTicks := func(t int64) int64 { // old ticks to new ticks
		for e := oldExp; e > p.tickExp; e-- {
			t *= 10
		}
		for e := oldExp; e < p.tickExp; e++ {
			t /= 10
		}
		return t
	}
	switch p.Kind {
	case TokenBucket:
		tokens := min(s.V/oldUnit, p.Burst)
		s.T, s.V = min(toTicks(s.T), nowT), tokens*p.scale
	case LeakyBucket:
		level := min(ceilDiv(s.V, oldUnit), p.Burst)
		s.T, s.V = min(toTicks(s.T), nowT), level*p.scale
	case GCRA:
		tat := s.T
		if s.V > 0 {
			tat++
		}
		s.T, s.V = toTicks(tat), 0
		if p.tickExp > oldExp {
			s.T++ // rounded down above; round the debt up instead
		}
	}
	return true
}

// ticks converts a time in µs to the limit's ticks; most limits count in µs and skip the
// division.
func (p *Params) ticks(now int64) int64 {
	if p.tick == 1 {
		return now
	}
	return now / p.tick
}

// refill brings a token bucket up to now and returns now in ticks.
func (p *Params) refill(s *State, now int64) int64 {
	nowT := p.ticks(now)
	if fp := p.fingerprint(); s.W != fp {
		if !p.convert(s, nowT) {
			s.T, s.V = nowT, p.capacity
		}
		s.W = fp
	}
	if nowT > s.T {
		if missing := p.capacity - s.V; missing > 0 && p.rate > 0 {
			if nowT-s.T >= ceilDiv(missing, p.rate) {
				s.V = p.capacity
			} else {
				s.V += (nowT - s.T) * p.rate
			}
		}
		s.T = nowT
	}
	s.V = min(s.V, p.capacity)
	return nowT
}

// leak brings a leaky bucket up to now and returns now in ticks.
func (p *Params) leak(s *State, now int64) int64 {
	nowT := p.ticks(now)
	if fp := p.fingerprint(); s.W != fp {
		if !p.convert(s, nowT) {
			s.T, s.V = nowT, 0
		}
		s.W = fp
	}
	if nowT > s.T {
		if s.V > 0 && p.rate > 0 {
			if nowT-s.T >= ceilDiv(s.V, p.rate) {
				s.V = 0
			} else {
				s.V -= (nowT - s.T) * p.rate
			}
		}
		s.T = nowT
	}
	return nowT
}

// gcraNormalize brings a GCRA key up to now (a TAT in the past is now) and returns now in ticks.
func (p *Params) gcraNormalize(s *State, now int64) int64 {
	nowT := p.ticks(now)
	if fp := p.fingerprint(); s.W != fp {
		p.convert(s, nowT)
		s.W = fp
	}
	if s.T < nowT || (s.T == nowT && s.V == 0) {
		s.T, s.V = nowT, 0
	}
	return nowT
}

// gcraDebt is max(TAT, now) - now in 1/rate ticks: how far the key is ahead of its schedule.
func (p *Params) gcraDebt(s *State, nowT int64) int64 {
	if s.T < nowT {
		return 0
	}
	return (s.T-nowT)*p.rate + s.V
}

// window returns the start (µs) of the window of length p.Period that holds now, aligned to the
// Unix epoch.
func (p *Params) window(now int64) int64 { return now - now%p.Period }

// fixedBounds returns the fixed window that holds now: epoch-aligned, or the calendar's.
func (p *Params) fixedBounds(now int64) (start, end int64) {
	if p.cal != nil {
		return p.cal.Window(now)
	}
	start = p.window(now)
	return start, start + p.Period
}

// fixedWindow decides a fixed window of [start, end), which holds now. It takes the bounds
// rather than finding them so that it stays a leaf (no frame) for epoch windows: a call to
// the calendar here cost every fixed window ~30 instructions a decision.
func (p *Params) fixedWindow(s *State, start, end, now, cost int64, r *Result) {
	if s.T != start {
		s.T, s.V = start, 0
	}
	count := s.V
	switch {
	case cost > p.Limit:
		r.Reason = ReasonCostExceedsCapacity
	case count+cost <= p.Limit || cost == 0:
		r.Allowed = true
		count += cost
	default:
		r.RetryAfter = end - now
	}
	r.Remaining = max(0, p.Limit-count)
	// The window's end, even for an empty window: callers (and Envoy's duration_until_reset)
	// read it as when the window turns over.
	r.ResetAfter = end - now
}

// slidingCounter decides on the counter's buckets: every unit admitted in the last period is in
// one, and only the oldest live bucket can straddle the window's start, (now-P, now] in ticks.
// Of that one the estimate takes the share of its span still inside the window, rounded up:
// its units are somewhere in [First, Last], so the estimate errs by less than its count, about
// Limit/CounterBuckets. T, V and W roll as they did for the old two-window estimate; the region
// sync reads them.
func (p *Params) slidingCounter(s *State, now, cost int64, r *Result) {
	start := p.window(now)
	if s.T != start {
		if s.T == start-p.Period {
			s.W = s.V
		} else {
			s.W = 0
		}
		s.T, s.V = start, 0
	}
	nowT := p.ticks(now)
	from := nowT - p.periodTicks // a unit at tick t is inside the window when t > from
	var bs []Bucket
	if s.Log != nil && len(s.Log.Buckets) > 0 {
		if s.Log.TickExp != p.tickExp {
			// Another period changed the tick: decide on the buckets converted, which
			// Commit stores; a look leaves them as they are.
			bs = p.convertBuckets(s.Log)
		} else {
			bs = s.Log.Buckets
		}
		bs = bs[liveFrom(bs, from):]
	}
	estimate := p.bucketEstimate(bs, from)
	switch {
	case cost > p.Limit:
		r.Reason = ReasonCostExceedsCapacity
	case estimate+cost <= p.Limit || cost == 0:
		r.Allowed = true
		estimate += cost
	default:
		r.RetryAfter = p.after(nowT, p.counterFits(bs, estimate, cost)+p.periodTicks-nowT, now)
	}
	r.Remaining = max(0, p.Limit-estimate)
	switch {
	case r.Allowed && cost > 0:
		r.ResetAfter = p.after(nowT, p.periodTicks, now)
	case len(bs) > 0:
		r.ResetAfter = p.after(nowT, bs[len(bs)-1].Last+p.periodTicks-nowT, now)
	}
}

// liveFrom returns the index of the first bucket with a unit inside a window that starts after
// tick from.
func liveFrom(bs []Bucket, from int64) int {
	i := 0
	for i < len(bs) && bs[i].Last <= from {
		i++
	}
	return i
}

// bucketEstimate is what the live buckets bs hold inside the window after tick from: all of
// every bucket but the first, and of the first the share of [First, Last] after from, rounded
// up (its units are assumed spread evenly; they lie somewhere in it).
func (p *Params) bucketEstimate(bs []Bucket, from int64) int64 {
	var sum int64
	for i := range bs {
		sum += bs[i].Count
	}
	if len(bs) > 0 && from >= bs[0].First {
		b := &bs[0] // Last > from >= First: the span is not empty
		sum -= b.Count - ceilDiv(b.Count*(b.Last-from), b.Last-b.First)
	}
	return sum
}

// counterFits returns the earliest tick t at which a window starting after t leaves room for
// cost, given that it does not now (estimate > Limit-cost): the window's start passes the oldest
// buckets whole, then into the first bucket i whose count and every later one's exceed the
// room by no more than its own count, until its share after t is at most the room left.
func (p *Params) counterFits(bs []Bucket, estimate, cost int64) int64 {
	var before int64 // the counts of the buckets after i
	for i := range bs {
		before += bs[i].Count
	}
	for i := range bs {
		b := &bs[i]
		before -= b.Count
		room := p.Limit - cost - before
		if room < 0 {
			continue
		}
		if b.First == b.Last {
			return b.Last
		}
		// The least t with ⌈Count·(Last-t)/(Last-First)⌉ <= room.
		return b.Last - room*(b.Last-b.First)/b.Count
	}
	return bs[len(bs)-1].Last // unreachable: room >= 0 at the last bucket, as cost <= Limit
}

// bucketCap is how much a counter's bucket holds before another one is opened.
func (p *Params) bucketCap() int64 { return max(1, ceilDiv(p.Limit, CounterBuckets)) }

// addBucket records cost units admitted at now in the counter's buckets: into the newest bucket
// while it has room (or holds this tick already), else into a new one. It never writes where
// an Undo saved before it can see: the newest bucket, which Undo saves, is changed in place, a
// new bucket goes past the saved length, and the buckets move back only into an array no
// running Undo saved a view of (bucketArrays): a lone op's Take uses the same array, a batch
// alternates two, neither allocates.
func (p *Params) addBucket(s *State, now, cost int64) {
	nowT := p.ticks(now)
	if s.Log == nil {
		s.Log = &Log{TickExp: p.tickExp}
	}
	lg := s.Log
	bs := lg.Buckets
	if lg.TickExp != p.tickExp {
		bs, lg.TickExp = p.convertBuckets(lg), p.tickExp
		lg.arrays.base = bs[:0]
	}
	bs = bs[liveFrom(bs, nowT-p.periodTicks):]
	if n := len(bs); n > 0 {
		if b := &bs[n-1]; b.Last >= nowT || b.Count+cost <= p.bucketCap() {
			b.Count += cost
			b.Last = max(b.Last, nowT)
			lg.Buckets = bs
			return
		}
	}
	if len(bs) == cap(bs) {
		// Pruning from the front used the array up: move the live buckets back to its
		// start, or, when an Undo may restore a view of it, to a new array.
		a := &lg.arrays
		var nb []Bucket
		switch spare := arrayEnd(a.spare); {
		case a.pinned == nil && cap(a.base) == CounterSlots:
			nb = a.base[:len(bs)] // no Undo running: in place
		case cap(a.spare) == CounterSlots && spare != a.pinned && spare != a.pinned2:
			nb = a.spare[:len(bs)]
			a.base, a.spare = a.spare[:0], a.base
		default:
			nb = make([]Bucket, len(bs), CounterSlots)
			a.base, a.spare = nb[:0], a.base
		}
		copy(nb, bs)
		bs = nb
		if len(bs) == CounterSlots {
			bs = mergeBuckets(bs)
		}
	}
	lg.Buckets = append(bs, Bucket{First: nowT, Last: nowT, Count: cost})
}

// mergeBuckets merges the two adjacent buckets with the least count between them (the oldest
// such pair), making room for one more.
func mergeBuckets(bs []Bucket) []Bucket {
	j := 0
	for i := 1; i+1 < len(bs); i++ {
		if bs[i].Count+bs[i+1].Count < bs[j].Count+bs[j+1].Count {
			j = i
		}
	}
	bs[j] = Bucket{First: bs[j].First, Last: bs[j+1].Last, Count: bs[j].Count + bs[j+1].Count}
	return append(bs[:j+1], bs[j+2:]...)
}

// convertBuckets returns lg's buckets in a new array, their ticks counted in p's tick: First
// rounded down and Last up, so that a bucket's span only widens.
func (p *Params) convertBuckets(lg *Log) []Bucket {
	bs := make([]Bucket, len(lg.Buckets), CounterSlots)
	for i, b := range lg.Buckets {
		first, last := b.First, b.Last
		for e := lg.TickExp; e > p.tickExp; e-- {
			first, last = first*10, last*10+9
		}
		for e := lg.TickExp; e < p.tickExp; e++ {
			first, last = first/10, ceilDiv(last, 10)
		}
		bs[i] = Bucket{First: first, Last: last, Count: b.Count}
	}
	return bs
}

func (p *Params) slidingLog(s *State, now, cost int64, r *Result) {
	if s.Log != nil {
		entries := s.Log.Entries
		i := 0
		for i < len(entries) && entries[i].At <= now-p.Period {
			s.V -= entries[i].Cost
			i++
		}
		s.Log.Entries = entries[i:]
	}
	sum := s.V
	switch {
	case cost > p.Limit:
		r.Reason = ReasonCostExceedsCapacity
	case sum+cost <= p.Limit || cost == 0:
		r.Allowed = true
		sum += cost
	default:
		need, freed := sum+cost-p.Limit, int64(0)
		for _, e := range s.Log.Entries {
			if freed += e.Cost; freed >= need {
				r.RetryAfter = e.At + p.Period - now
				break
			}
		}
	}
	r.Remaining = max(0, p.Limit-sum)
	switch {
	case r.Allowed && cost > 0:
		r.ResetAfter = p.Period
	case s.Log != nil && len(s.Log.Entries) > 0:
		r.ResetAfter = s.Log.Entries[len(s.Log.Entries)-1].At + p.Period - now
	}
}
