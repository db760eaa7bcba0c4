package redis

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// Coalescing: concurrent Apply calls bound for one lane (the server, or one hash slot of a
// Cluster, since one script call may touch one slot only) are decided by one multi.lua call,
// each batch still all or nothing at its own turn. A lane has at most one call in flight and
// flushes what gathered meanwhile as soon as it returns: no timer, so a lone request goes out
// at once and a busy lane sends bigger calls. The fixed cost of a script call in Redis, and the
// round trip's system calls on both sides, are then shared.

// maxCoalesced bounds the batches of one call, so that one call holds Redis only briefly.
const maxCoalesced = 128

// yieldBelow is how few waiting batches make a lane yield once before it sends them (see loop).
const yieldBelow = 16

// A pending batch is one group of one Apply waiting in a lane. It is pooled. The caller owns it
// until submit, the lane from then until it sets the state: answered hands it back to the
// caller, who recycles it; a caller that left first set abandoned, and the lane recycles it;
// expired (its lane's watch found its deadline passed, see expire) is recycled by no one, since
// the lane may still read it and the caller holds the watch's token: it is left to the
// collector, on a path only a late store takes.
type pending struct {
	keys, args []string     // the group's, built fresh for this call: never the caller's batch
	due        atomic.Int64 // the caller's deadline, in the store's monotonic ns (Store.since)
	state      atomic.Int32
	done       chan struct{} // buffered: one token, from the lane or the watch, never both

	vals []int64 // batch.lua's reply, reused across uses
	err  error

	plain []plainOp // the batch's ops when plain commands may count them (plain.go)
	slot  uint16    // on a Cluster: a node's lane gathers batches of many slots
}

const (
	pendingQueued int32 = iota
	pendingAnswered
	pendingAbandoned
	pendingExpired
)

// lane gathers the pending batches of one server, or on a Cluster of one primary (once the
// slot map is read: route.go) or of one slot (before, or where plain windows are off).
type lane struct {
	s       *Store
	slot    uint16                    // a slot's lane
	node    atomic.Pointer[nodeRoute] // a primary's lane: that node as the last slot map read
	run     func()                    // l.loop, bound once: `go l.loop()` would allocate a closure each time
	mu      sync.Mutex
	queue   []*pending
	flight  []*pending // what loop is deciding, for the watch; written under mu only
	spare   []*pending // the other buffer: the queue and the flight swap
	running bool       // a goroutine runs loop; it stops when the queue is empty
	// watch fires at watchAt (Store.since ns; 0 when stopped), no later than the earliest
	// deadline waiting in the lane, and lets callers whose deadline passed leave (expire).
	watch   *time.Timer
	watchAt int64

	liveBuf []*pending // flush's live batches: the flight itself is the watch's

	plainBuf, scriptBuf []*pending   // flush's split of a flight (plain.go)
	runs                [][]*pending // slotRuns
	counting            map[string]int32
	incs                []counted
	windows             windowNames
}

func newLane(s *Store, slot uint16) *lane {
	l := &lane{s: s, slot: slot}
	l.run = l.loop
	l.watch = time.AfterFunc(time.Hour, l.expire)
	l.watch.Stop()
	return l
}

// laneFor returns the lane of a slot: the only lane of a single server; on a Cluster the
// lane of the slot's primary where plain windows know it, else the slot's own.
func (s *Store) laneFor(slot uint16) *lane {
	if !s.cluster {
		return s.lane
	}
	if s.plainUsable() {
		if r := s.routeFor(slot); r != nil {
			return r.lane
		}
	}
	if l := s.slotLanes[slot].Load(); l != nil {
		return l
	}
	l := newLane(s, slot)
	if !s.slotLanes[slot].CompareAndSwap(nil, l) {
		return s.slotLanes[slot].Load()
	}
	return l
}

// submit queues p and starts the lane's goroutine if it is idle. A lane already holding
// maxWaiting batches (a store that stopped answering, callers leaving at their deadlines)
// refuses p rather than grow without bound.
func (l *lane) submit(p *pending) error {
	l.mu.Lock()
	if len(l.queue) >= maxWaiting {
		l.mu.Unlock()
		return errBacklog
	}
	l.queue = append(l.queue, p)
	if due := p.due.Load(); l.watchAt == 0 || due < l.watchAt {
		l.watchAt = due
		l.watch.Reset(time.Duration(due - l.s.since()))
	}
	start := !l.running
	l.running = true
	l.mu.Unlock()
	if start {
		go l.run()
	}
	return nil
}

// loop sends what gathered, up to maxCoalesced batches a call, until the queue is empty.
func (l *lane) loop() {
	for {
		l.mu.Lock()
		if n := len(l.queue); n > 0 && n < yieldBelow {
			// A few waiting: let the callers that are running (gRPC handlers mid-decision)
			// join them first. A call shared by more requests costs each fewer system calls
			// and wake-ups, which on a busy host is throughput (docs/measurements.md); with
			// nothing else to run the yield returns at once.
			l.mu.Unlock()
			runtime.Gosched()
			l.mu.Lock()
		}
		var flight []*pending
		switch n := len(l.queue); {
		case n == 0:
			l.running = false
			l.mu.Unlock()
			return
		case n <= maxCoalesced:
			flight, l.queue, l.spare = l.queue, l.spare[:0], nil
		default:
			flight = append(l.spare[:0], l.queue[:maxCoalesced]...)
			rest := copy(l.queue, l.queue[maxCoalesced:])
			clear(l.queue[rest:])
			l.queue = l.queue[:rest]
		}
		l.flight = flight
		l.mu.Unlock()
		l.flush(flight)
		l.mu.Lock()
		clear(flight)
		l.flight, l.spare = nil, flight[:0]
		l.mu.Unlock()
	}
}

// flush decides the live batches of flight in one call and answers each. flight is only
// read: the watch may read it too.
func (l *lane) flush(flight []*pending) {
	now := l.s.since()
	live := l.liveBuf[:0]
	defer func() {
		clear(live)
		l.liveBuf = live[:0]
	}()
	var latest int64
	for _, p := range flight {
		switch due := p.due.Load(); {
		case p.state.Load() != pendingQueued:
			l.s.answer(p) // its caller left (recycled) or its deadline passed (left as is)
		case due <= now:
			p.err = context.DeadlineExceeded
			l.s.answer(p)
		default:
			live = append(live, p)
			latest = max(latest, due)
		}
	}
	if len(live) == 0 {
		return
	}
	deadline := l.s.clock.born.Add(time.Duration(latest))
	// The latest of the callers' deadlines: each caller leaves at its own. The lane makes the
	// round trip itself, not on a goroutine of do's: a caller waiting past its deadline is
	// woken by the lane's watch (see expire), so leaving a call stuck in rueidis buys nothing
	// here, and the hand-off to that goroutine and back was a cost of every call. A lane stuck
	// in rueidis holds its queue, which is bounded (maxWaiting), until rueidis returns.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if route := l.route(); route != nil {
		now, known := route.clock.now()
		if l.s.now != nil {
			now, known = l.s.now(), true
		}
		plain, scripts := l.plainBuf[:0], l.scriptBuf[:0]
		for _, p := range live {
			if len(p.plain) > 0 && known && l.s.plainFits(p, now) {
				plain = append(plain, p)
			} else {
				scripts = append(scripts, p)
			}
		}
		if len(plain) > 0 {
			l.flushPlain(ctx, route, plain, scripts)
			clear(plain)
			clear(scripts)
			l.plainBuf, l.scriptBuf = plain[:0], scripts[:0]
			return
		}
	}
	runs := l.slotRuns(live)
	execs := make([]rueidis.LuaExec, len(runs))
	for i, run := range runs {
		l.s.coalescedCalls.Add(1)
		l.s.coalescedBatches.Add(uint64(len(run)))
		execs[i] = multiExec(run)
	}
	replies := l.s.run(ctx, multiScript, multiFunction, execs)
	received := l.s.clock.local()
	for i, run := range runs {
		l.s.answerMulti(run, replies[i], l.s.scriptClock(), received)
	}
	clear(runs)
}

// slotRuns orders batches by slot and returns the runs of one slot each: a script call takes
// one slot's keys, and a primary's lane gathers many slots. The runs are valid until the next
// call.
func (l *lane) slotRuns(batches []*pending) [][]*pending {
	runs := l.runs[:0]
	if !l.s.cluster || !slices.ContainsFunc(batches, func(p *pending) bool { return p.slot != batches[0].slot }) {
		runs = append(runs, batches)
		l.runs = runs
		return runs
	}
	slices.SortStableFunc(batches, func(a, b *pending) int { return cmp.Compare(a.slot, b.slot) })
	start := 0
	for i := 1; i <= len(batches); i++ {
		if i == len(batches) || batches[i].slot != batches[start].slot {
			runs = append(runs, batches[start:i])
			start = i
		}
	}
	l.runs = runs
	return runs
}

// route is where the lane's flights may count plain windows, or nil where they may not (see
// plainUsable) or the slot's primary is not known yet.
func (l *lane) route() *nodeRoute {
	switch {
	case !l.s.plainUsable():
		return nil
	case l.s.cluster:
		if r := l.node.Load(); r != nil {
			return r
		}
		return l.s.routeFor(l.slot)
	default:
		return &l.s.single
	}
}

// scriptClock is the clock a script's reply through the store's client bounds: a single
// server's. On a Cluster none: the client may have followed a redirection to another node, and
// each node's clock is read only from its own TIMEs (route.go).
func (s *Store) scriptClock() *redisClock {
	if s.cluster {
		return nil
	}
	return &s.clock
}

// multiExec is one multi.lua call deciding batches. Fresh slices, as a pending batch's are:
// rueidis may still write a call's strings after the call timed out.
func multiExec(batches []*pending) rueidis.LuaExec {
	nkeys, nargs := 0, 0
	for _, p := range batches {
		nkeys += len(p.keys)
		nargs += len(p.args)
	}
	keys := make([]string, 0, nkeys)
	args := make([]string, 0, nargs)
	for _, p := range batches {
		keys = append(keys, p.keys...)
		args = append(args, p.args...)
	}
	return rueidis.LuaExec{Keys: keys, Args: args}
}

// fcall is multiExec as a command of the library, for a pipeline of other commands.
func (s *Store) fcall(batches []*pending) rueidis.Completed {
	s.coalescedCalls.Add(1)
	s.coalescedBatches.Add(uint64(len(batches)))
	e := multiExec(batches)
	return s.client.B().Fcall().Function(multiFunction).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
}

// answerFcall answers batches from the reply of their fcall, sent to route's node. A node that
// lost the library gets it again, and one that no longer serves the slot (a Cluster's) passes
// it to the store's client: the call is made once more (see run), which is safe since the
// node ran nothing.
func (s *Store) answerFcall(ctx context.Context, route *nodeRoute, batches []*pending, reply rueidis.RedisResult, received int64) {
	clock := route.clock
	if err := reply.Error(); err != nil && (strings.Contains(err.Error(), "Function not found") || redirected(reply)) {
		reply = s.run(ctx, multiScript, multiFunction, []rueidis.LuaExec{multiExec(batches)})[0]
		clock, received = s.scriptClock(), s.clock.local()
	}
	s.answerMulti(batches, reply, clock, received)
}

// answerMulti answers batches from the reply of the multi.lua call that decided them, which
// came in at received (redisClock.local): the reply's time bounds clock, the clock of the node
// that ran it (nil when that is not known), from then on.
func (s *Store) answerMulti(live []*pending, reply rueidis.RedisResult, clock *redisClock, received int64) {
	msgs, err := reply.ToArray()
	// The reply is flat: each batch's values follow the one before's (see multi.lua), so the
	// whole of it is read before anyone is answered.
	at := 0
	for _, p := range live {
		if err != nil {
			break
		}
		var next int
		// A pending batch's args are its head and one string per op.
		p.vals, next, p.err = decodeBatch(msgs, at, len(p.args)-1, p.vals[:0])
		if next < 0 {
			err = p.err
		}
		at = next
	}
	if err == nil && at != len(msgs) {
		err = fmt.Errorf("script answered %d values, %d more than %d batches take", len(msgs), len(msgs)-at, len(live))
	}
	if p := live[0]; clock != nil && err == nil && p.err == nil && len(p.vals) >= 2 {
		clock.observe(p.vals[1], received)
	}
	for _, p := range live {
		if err != nil {
			p.err = err
		}
		s.answer(p)
	}
}

// answer hands p back to its caller, or recycles it when the caller left.
func (s *Store) answer(p *pending) {
	if p.state.CompareAndSwap(pendingQueued, pendingAnswered) {
		p.done <- struct{}{}
		return
	}
	if p.state.Load() == pendingAbandoned {
		s.recyclePending(p)
	}
}

// since is the store's monotonic clock, in ns: what a pending batch's deadline is kept in.
func (s *Store) since() int64 { return int64(time.Since(s.clock.born)) }

// expire is the lane's watch: it lets the callers whose deadline passed leave, those waiting
// in the queue and those in a flight that has not come back (a store that stopped answering,
// rueidis waiting for room or a connection), and sets itself for the next deadline. One timer
// per lane, set again only when a batch comes with a sooner deadline, instead of one per
// caller reset and stopped around every wait: the wait is then a bare receive.
func (l *lane) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now, next := l.s.since(), int64(0)
	for _, waiting := range [2][]*pending{l.queue, l.flight} {
		for _, p := range waiting {
			// A batch of the flight may have been answered, recycled and taken by another
			// call since: its state and deadline are that call's, which is as right.
			if p.state.Load() != pendingQueued {
				continue
			}
			due := p.due.Load()
			if due > now {
				if next == 0 || due < next {
					next = due
				}
				continue
			}
			if p.state.CompareAndSwap(pendingQueued, pendingExpired) {
				p.done <- struct{}{}
			}
		}
	}
	l.watchAt = next
	if next != 0 {
		l.watch.Reset(time.Duration(next - now))
	}
}

func (s *Store) recyclePending(p *pending) {
	p.keys, p.args, p.err, p.vals = nil, nil, nil, p.vals[:0]
	clear(p.plain)
	p.plain = p.plain[:0]
	s.pendings.Put(p)
}

// coalesced decides the groups through their lanes, execs[i] for groups[i], and fills
// answers[i] with each group's reply values or error, valid until release. It returns an error
// of the whole request when the deadline passed first. A caller whose ctx is cancelled while
// it waits leaves at its deadline, which is the store's short one (the breaker's, or its
// timeout): the wait is a bare receive, woken by the lane or by its watch (see expire).
func (s *Store) coalesced(ctx context.Context, deadline time.Time, b *store.Batch, groups []group, execs []rueidis.LuaExec, answers []answer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(s.timeout)
	}
	due := int64(deadline.Sub(s.clock.born))
	for gi := range groups {
		p := s.pendings.Get().(*pending)
		p.keys, p.args, p.slot = execs[gi].Keys, execs[gi].Args, groups[gi].slot
		s.plainOps(p, b, &groups[gi])
		p.due.Store(due)
		p.state.Store(pendingQueued)
		if err := s.laneFor(groups[gi].slot).submit(p); err != nil {
			s.recyclePending(p)
			s.abandon(answers[:gi])
			return err
		}
		answers[gi].p = p
	}
	for gi := range answers {
		p := answers[gi].p
		<-p.done
		if p.state.Load() == pendingExpired {
			s.abandon(answers)
			return context.DeadlineExceeded
		}
		answers[gi].vals, answers[gi].err, answers[gi].got = p.vals, p.err, true
	}
	return nil
}

// abandon leaves the pending batches of answers: those the lane answered are recycled here,
// those still waiting by the lane, and expired ones by no one.
func (s *Store) abandon(answers []answer) {
	for i := range answers {
		a := answers[i]
		answers[i] = answer{}
		if a.p == nil || !a.got && a.p.state.CompareAndSwap(pendingQueued, pendingAbandoned) {
			continue
		}
		if !a.got {
			if a.p.state.Load() == pendingExpired {
				continue
			}
			<-a.p.done // answered, or about to be
		}
		s.recyclePending(a.p)
	}
}

// answer is one group's reply: batch.lua's values, or why there are none.
type answer struct {
	vals []int64
	err  error
	p    *pending // the coalesced path's, recycled by release
	got  bool     // p was answered and its done received
}

// release recycles the pending batches behind answers.
func (s *Store) release(answers []answer) {
	for i := range answers {
		if p := answers[i].p; p != nil {
			answers[i] = answer{}
			s.recyclePending(p)
		}
	}
}

// smallInts are the decimal strings of small counts, which every call sends several of.
var smallInts = func() (t [1024]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func smallInt(n int) string {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}

// CoalesceStats returns how many script calls the lanes made and how many batches they
// decided: batches/calls is the mean number of requests sharing a call.
func (s *Store) CoalesceStats() (calls, batches uint64) {
	return s.coalescedCalls.Load(), s.coalescedBatches.Load()
}
