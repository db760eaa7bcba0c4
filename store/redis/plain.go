package redis

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Plain windows: a request whose limits are all fixed windows far from their limits is counted
// with plain commands, HINCRBY on the window's field of the key's hash and PEXPIREAT (the same
// count the scripts keep: lua/prelude.lua, load_fixed), rather than by a script, whose
// interpreter was most of what a check cost Redis (docs/measurements.md, issue 31). The
// commands go in the lane's pipeline with the script call of the batches that need one.
//
// The node picks each op's window from its estimate of Redis's clock; two TIME commands, one
// before the increments and one after, bracket the instant Redis ran them. A batch is allowed
// when every op's window is the one that bracket holds and every count is within its limit.
// Otherwise (a count over its limit, a window edge, a wrong estimate, an error) its increments
// are given back and the batch is decided by the script, exactly, in the next round trip. So
// nothing is ever admitted past a limit, and a denial consumes nothing; what the fast path
// trades is that a count stands high by the increments of batches about to fall back until
// their give-back lands, one round trip later, and a request decided in between may be denied
// by that much. Keys whose count came near their limit (nearMargin) are sent to the script
// until their window ends, so that only requests racing each other across that margin ever
// fall back.

// plainOp is one op of a batch that may be counted with plain commands.
type plainOp struct {
	key           string // the Redis key: the hash of the op's window counts
	hash          int64  // keyHash(key)
	limit, period int64
	cost          int64
	start         int64 // the window the op was sent for (µs, Redis's clock)
	inc           int32 // its key's increment in the flush (see counted)
	upTo          int64 // the increment's cost up to and with this op
}

// plainGuard keeps the fast path away from a window's end: a window that ends within it of
// redisClock's bound is left to the script, since Redis's clock may be past the bound by a
// round trip and then the increments would land in a window that is over (and fall back).
const plainGuard = 5 * time.Millisecond

// nearSize is the number of keys the near table remembers (a direct-mapped table: a key that
// takes another's place only sends that one to the script once more).
const nearSize = 1 << 14

// nearMargin is how close to its limit a count may come before its key is left to the script
// for the rest of the window.
func nearMargin(limit, cost int64) int64 { return max(cost, limit/8) }

// keyTable remembers keys, each until an instant, by their hash (keyHash): the keys near their
// limit until their window ends, and those this node gave their window's expiry.
type keyTable struct {
	entries [nearSize]struct{ hash, until atomic.Int64 }
}

// keyHash is a key's hash in the store's key tables, computed once per op.
func (s *Store) keyHash(key string) int64 { return int64(maphash.String(s.keySeed, key)) }

// holds reports whether the key of hash h was marked until after now.
func (n *keyTable) holds(h, now int64) bool {
	e := &n.entries[uint64(h)%nearSize]
	return e.hash.Load() == h && e.until.Load() > now
}

// is reports whether the key of hash h was marked until exactly until.
func (n *keyTable) is(h, until int64) bool {
	e := &n.entries[uint64(h)%nearSize]
	return e.hash.Load() == h && e.until.Load() == until
}

func (n *keyTable) mark(h, until int64) {
	e := &n.entries[uint64(h)%nearSize]
	e.until.Store(until)
	e.hash.Store(h)
}

// redisClock bounds Redis's clock (µs) from below, from the TIMEs it answered, against this
// process's monotonic clock. The bound chooses which window a request is sent for: a window
// Redis has certainly reached, never one ahead of it, since an increment sent early would meet
// the window's count before the window began, where the script (which starts a window's count
// afresh) or the key's expiry could drop it and the give-back then take from the window's real
// count. Sent late, an increment lands in a window that is over and is given back there, which
// no one reads again. The TIMEs around the increments tell the two apart.
type redisClock struct {
	born time.Time
	// at is a TIME Redis answered minus the local instant its reply came in: Redis's clock was
	// at least at + local() whenever local() was read since, give or take the clocks' drift.
	at    atomic.Int64
	known atomic.Bool
	since atomic.Int64 // local() when at was set
}

// clockDrift is the most two hosts' clocks are taken to part by (NTP slews by 500 ppm at most;
// twice that for both), and clockMargin is kept below the bound besides.
const (
	clockDrift  = 1000 // per million
	clockMargin = 1000 // µs
)

func (c *redisClock) local() int64 { return time.Since(c.born).Microseconds() }

// observe takes a TIME Redis read before the local instant received, when its reply came in.
func (c *redisClock) observe(redisNow, received int64) {
	c.at.Store(redisNow - received)
	c.since.Store(received)
	c.known.Store(true)
}

// now is a bound below Redis's clock, and whether there is one yet.
func (c *redisClock) now() (int64, bool) {
	if !c.known.Load() {
		return 0, false
	}
	local := c.local()
	age := local - c.since.Load()
	return local + c.at.Load() - clockMargin - age*clockDrift/1_000_000, true
}

// WithPlainWindows turns plain windows (plain.go) on or off; the URL's plain_windows=false
// turns them off too. They are on by default where they apply: Redis Functions and coalescing.
// On a Cluster they go to each slot's primary directly (route.go).
func WithPlainWindows(on bool) Option { return func(s *Store) { s.plainWindows = on } }

// PlainStats returns how many batches plain commands decided and how many of those attempts
// fell back to the script.
func (s *Store) PlainStats() (decided, fellBack uint64) {
	return s.plainDecided.Load(), s.plainFellBack.Load()
}

// plainOps fills p.plain with b's ops when each may be counted with plain commands, and
// returns whether they may.
func (s *Store) plainOps(p *pending, b *store.Batch, g *group) bool {
	p.plain = p.plain[:0]
	if !s.plainUsable() || len(b.IdempotencyKey) > 0 || b.Lease {
		return false
	}
	for j, i := range g.ops {
		op := &b.Ops[i]
		pr := op.Params
		if pr.Kind != algorithm.FixedWindow || pr.Calendar() != nil || pr.Period%1000 != 0 || pr.Drains() ||
			op.Counter || op.Slot != nil || op.Cost < 1 || op.Cost > pr.Limit {
			p.plain = p.plain[:0]
			return false
		}
		p.plain = append(p.plain, plainOp{key: g.keys[j], hash: s.keyHash(g.keys[j]), limit: pr.Limit, period: pr.Period, cost: op.Cost})
	}
	return len(p.plain) > 0
}

// plainFits reports whether p's ops may go plain at now (redisClock's bound), and sets the
// window each is sent for.
func (s *Store) plainFits(p *pending, now int64) bool {
	guard := plainGuard.Microseconds()
	for i := range p.plain {
		op := &p.plain[i]
		start := now - now%op.period
		if start+op.period-now <= guard || s.near.holds(op.hash, now) {
			return false
		}
		op.start = start
	}
	return true
}

// expireAt is the PEXPIREAT argument of a window that ends at end (µs): the last millisecond
// that starts before it, as lua/prelude.lua's save_fixed.
func expireAt(end int64) int64 { return (end - 1) / 1000 }

// plainUsable reports whether plain windows apply to this store at all (see WithPlainWindows).
func (s *Store) plainUsable() bool {
	return s.plainWindows && s.coalesce && s.functions
}

// counted is one key's increment in a flush: the ops of the flight on that key and window
// are counted by one HINCRBY of their summed cost (every request of a flight touches the
// global key, say), each op reading its own count off the sum (see flushPlain).
type counted struct {
	key    string // the first op's string: read only until a batch is answered
	hash   int64  // keyHash(key)
	field  string
	start  int64
	end    int64
	cost   int64  // the flight's ops' costs, summed in flight order
	expire string // PEXPIREAT's argument (expireAt)
	reply  int    // the index of its HINCRBY's reply
	// expires is set when a PEXPIREAT follows the HINCRBY: the first this node sends for the
	// key's window (see Store.expiring).
	expires bool
}

// windowName is a window's strings: its field and its key's expiry (expireAt).
type windowName struct {
	start, period int64
	field, expire string
}

// windowNames keeps the names of the last few windows a lane counted in (a policy has few
// periods), so that they are formatted once rather than for every key.
type windowNames [4]windowName

func (w *windowNames) of(start, period int64) *windowName {
	for i := range w {
		if w[i].start == start && w[i].period == period && w[i].field != "" {
			return &w[i]
		}
	}
	copy(w[1:], w[:len(w)-1])
	w[0] = windowName{start: start, period: period, field: strconv.FormatInt(start, 10),
		expire: strconv.FormatInt(expireAt(start+period), 10)}
	return &w[0]
}

// flushPlain decides the live batches, those in plain by plain commands and the others by one
// script call, in one round trip; batches whose plain attempt failed are given back and
// decided by the script in a second.
//
// The ops of the flight on one key and window share one HINCRBY, as if sent one after the
// other in flight order: an op's count is the sum's reply less the costs of the ops after it,
// and it fits its limit when that count does. One that does not fails its batch, which falls
// back; the ops before it stand, as they would have alone.
func (l *lane) flushPlain(ctx context.Context, route *nodeRoute, plain, scripts []*pending) {
	s := l.s
	test := s.now != nil
	if l.counting == nil {
		l.counting = make(map[string]int32)
	}
	incs := l.incs[:0]
	for _, p := range plain {
		for i := range p.plain {
			op := &p.plain[i]
			c, ok := l.counting[op.key]
			if !ok || incs[c].start != op.start {
				c = int32(len(incs))
				l.counting[op.key] = c
				w := l.windows.of(op.start, op.period)
				incs = append(incs, counted{key: op.key, hash: op.hash, field: w.field, expire: w.expire, start: op.start, end: op.start + op.period})
			}
			incs[c].cost += op.cost
			op.inc, op.upTo = c, incs[c].cost
		}
	}
	// The keys are the callers' strings (see Apply's scratch), which a caller answered below
	// may reuse: forgotten before anyone is.
	clear(l.counting)
	l.incs = incs
	cmds := make(rueidis.Commands, 0, 2*len(incs)+3)
	if !test {
		cmds = append(cmds, s.client.B().Time().Build())
	}
	for i := range incs {
		c := &incs[i]
		c.reply = len(cmds)
		cmds = append(cmds, s.client.B().Arbitrary("HINCRBY").Args(c.key, c.field, amount(c.cost)).Build())
		// A key this node already gave its window's expiry keeps it: the key lives only
		// for that window (see save_fixed), so it is not sent again.
		if c.expires = !s.expiring.is(c.hash, c.end); c.expires {
			cmds = append(cmds, s.client.B().Arbitrary("PEXPIREAT").Args(c.key, c.expire, "NX").Build())
		}
	}
	second := len(cmds)
	if !test {
		cmds = append(cmds, s.client.B().Time().Build())
	}
	var runs [][]*pending
	calls := len(cmds)
	if len(scripts) > 0 {
		runs = l.slotRuns(scripts)
		for _, run := range runs {
			cmds = append(cmds, s.fcall(run))
		}
	}
	replies := route.client.DoMulti(ctx, cmds...)
	received := s.clock.local()
	if s.cluster && slices.ContainsFunc(replies, redirected) {
		s.redirects.Add(1)
		s.refreshRoutes(routeRefreshEvery)
	}
	for i, run := range runs {
		s.answerFcall(ctx, route, run, replies[calls+i], received)
	}
	clear(runs)

	var t1, t2 int64
	var err error
	if test {
		t1 = s.now()
		t2 = t1
	} else {
		if t1, err = redisTime(replies[0]); err == nil {
			t2, err = redisTime(replies[second])
		}
		if err == nil {
			route.clock.observe(t1, received)
		} else if s.cluster {
			s.refreshRoutes(routeRefreshEvery) // the primary may have failed over
		}
	}
	var repairs rueidis.Commands
	for i := range incs {
		c := &incs[i]
		if c.expires {
			if _, perr := replies[c.reply+1].AsInt64(); perr == nil {
				s.expiring.mark(c.hash, c.end)
			}
		} else if sum, cerr := replies[c.reply].AsInt64(); cerr == nil && sum == c.cost {
			// A fresh count on a key this node had given its expiry: the key went in
			// between (a reset, an eviction), and the increment made it anew without one.
			repairs = append(repairs, s.client.B().Arbitrary("PEXPIREAT").Args(c.key, c.expire, "NX").Build())
		}
	}
	if len(repairs) > 0 {
		// Before any caller is answered: the keys are theirs (see counting).
		route.client.DoMulti(ctx, repairs...)
	}
	var refunds rueidis.Commands
	var fallback []*pending
	for _, p := range plain {
		ok := err == nil
		p.vals = append(p.vals[:0], decided, t1)
		for i := range p.plain {
			op := &p.plain[i]
			c := &incs[op.inc]
			sum, cerr := replies[c.reply].AsInt64()
			count := sum - (c.cost - op.upTo)
			switch {
			case cerr != nil:
				ok = false
			case count > op.limit:
				ok = false
				s.near.mark(op.hash, c.end)
			case count > op.limit-nearMargin(op.limit, op.cost):
				s.near.mark(op.hash, c.end)
			}
			if t1 < op.start || t2 >= c.end {
				ok = false // Redis's clock was not in the window the op was sent for
			}
			p.vals = append(p.vals, 1, 0, op.limit-count, c.end-t1, 0, 0)
		}
		if ok {
			s.plainDecided.Add(1)
			s.answer(p)
			continue
		}
		if err != nil {
			// Nothing is known of what Redis ran: as any call that failed.
			p.err = err
			s.answer(p)
			continue
		}
		// Give back what the batch counted, then decide it by the script. By the batch's own
		// key strings: its increment's may be those of a batch already answered.
		s.plainFellBack.Add(1)
		for i := range p.plain {
			op := &p.plain[i]
			c := &incs[op.inc]
			if replies[c.reply].Error() != nil {
				continue
			}
			refunds = append(refunds,
				s.client.B().Arbitrary("HINCRBY").Args(op.key, c.field, amount(-op.cost)).Build(),
				s.client.B().Arbitrary("PEXPIREAT").Args(op.key, c.expire, "NX").Build())
		}
		fallback = append(fallback, p)
	}
	clear(incs)
	if len(fallback) == 0 {
		return
	}
	// A give-back that failed leaves its units counted for the rest of the window: quota
	// lost, never granted twice; the script decides the batch all the same.
	runs, calls = l.slotRuns(fallback), len(refunds)
	for _, run := range runs {
		refunds = append(refunds, s.fcall(run))
	}
	replies = route.client.DoMulti(ctx, refunds...)
	received = s.clock.local()
	for i, run := range runs {
		s.answerFcall(ctx, route, run, replies[calls+i], received)
	}
	clear(runs)
}

// amount is an increment as HINCRBY takes it: the keys' commands go to the one server, so they
// are built as arbitrary commands, without the slot a key's builder hashes for a Cluster.
func amount(n int64) string { return smallInt(int(n)) }

// redisTime reads a TIME reply in µs.
func redisTime(r rueidis.RedisResult) (int64, error) {
	parts, err := r.AsStrSlice()
	if err != nil {
		return 0, err
	}
	if len(parts) != 2 {
		return 0, errors.New("TIME answered no seconds and microseconds")
	}
	sec, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return 0, err
	}
	usec, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return 0, err
	}
	return sec*1_000_000 + usec, nil
}
