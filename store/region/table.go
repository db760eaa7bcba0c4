package region

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/algorithm"
)

// windowSlots is how many windows of a key the table keeps per peer: the current one, the
// previous one (sliding_window_counter weighs it) and one that a late message may still fill.
const windowSlots = 3

// table holds what the other regions last reported: per key and peer, counts by window and
// the peer's recent rate.
type table struct {
	mu    sync.RWMutex
	keys  map[string]*remoteKey
	peers int
}

// remoteKey is one key's counts in the other regions, by peer index.
type remoteKey struct {
	per     []peerCount
	updated int64 // µs, the last report of any peer
	// own is this region's count as of its last read (the current window and the previous
	// one), read at ownAt (µs), for sharing what is left of the limit (remote).
	own   [2]windowCount
	ownAt int64
}

// peerCount is one peer's reports of a key.
type peerCount struct {
	win  [windowSlots]windowCount
	rate float64 // per second
}

type windowCount struct{ start, count int64 }

func (t *table) init(peers int) {
	t.keys = map[string]*remoteKey{}
	t.peers = peers
}

// count returns the peer's count of the window that starts at start, 0 if it reported none.
func (pc *peerCount) count(start int64) int64 {
	for i := range pc.win {
		if pc.win[i].start == start {
			return pc.win[i].count
		}
	}
	return 0
}

// observe merges one reported count: counts are grow-only per window, so the larger wins and
// repeats or reordering change nothing.
func (pc *peerCount) observe(start, count int64) {
	oldest := 0
	for i := range pc.win {
		w := &pc.win[i]
		if w.start == start {
			w.count = max(w.count, count)
			return
		}
		if w.start < pc.win[oldest].start {
			oldest = i
		}
	}
	if start > pc.win[oldest].start {
		pc.win[oldest] = windowCount{start, count}
	}
}

// peer is another region as this node sees it.
type peer struct {
	name, addr string
	// heard is when a message from the peer arrived or a message to it was acknowledged (µs);
	// 0 before either.
	heard atomic.Int64
	// fromPeer is when the last Sync from the peer arrived (µs), the age of its counts.
	fromPeer atomic.Int64
	// delay is the measured one-way delay to the peer (µs): half the round trip of Sync calls,
	// smoothed.
	delay atomic.Int64
	// stale follows how late the peer's syncs arrive and how long they take, as observed.
	stale staleness

	client
}

// remote returns what the other regions take of key's limit at now: their last counts plus,
// unless turned off, the reservation of their in-flight demand, rounded up; and, when this
// region and others admitted in this window, all but this region's share of what is left.
//
// The share is why the limit is met from below when syncs run late or demand comes in bursts
// (a busy machine's senders fall behind, then catch up): regions near the limit see their
// reservations of each other fade together, as their admitted rates do, and would each fill
// the whole room left before hearing that the others did. Each takes 1/n of it per the time
// its admissions take to be seen by the others instead, n counting the regions that admitted
// in the window: what is left shrinks geometrically. A region that has not admitted in the
// window yet, or whose peers have not, is not refilling anything: it keeps all that is left,
// so a first burst there is not cut.
func (r *Region) remote(key []byte, p *algorithm.Params, now int64) int64 {
	t := &r.table
	t.mu.RLock()
	rk := t.keys[string(key)]
	if rk == nil {
		t.mu.RUnlock()
		return 0
	}
	period := p.Period
	start := now - now%period
	f := float64(now-start) / float64(period)
	sync := r.cfg.Sync.Microseconds()
	var sum float64
	active, horizon := 1, sync
	for j := range rk.per {
		pc := &rk.per[j]
		c := pc.count(start)
		unseen := r.unseen(r.peers[j], now, sync, start)
		if c > 0 {
			active++
			horizon = max(horizon, unseen)
		}
		sum += float64(c)
		if p.Kind == algorithm.SlidingWindowCounter {
			sum += float64(pc.count(start-period)) * (1 - f)
		}
		if r.cfg.NoReservation || pc.rate <= 0 {
			continue
		}
		sum += pc.rate * float64(unseen) / 1e6
	}
	var own float64
	ownAt := rk.ownAt
	for _, w := range rk.own {
		switch {
		case w.start == start:
			own += float64(w.count)
		case w.start == start-period && p.Kind == algorithm.SlidingWindowCounter:
			own += float64(w.count) * (1 - f)
		}
	}
	t.mu.RUnlock()
	others := math.Ceil(sum - 1e-9)
	if r.cfg.NoReservation || r.noShare || active == 1 || own <= 0 {
		return int64(others)
	}
	left := float64(p.Limit) - own - others
	if left <= 0 {
		return int64(others)
	}
	// The share grows with the time since this region's count was read, to all of left/n a
	// horizon after: a region whose reads run late (a busy machine) refills at the same pace
	// as one whose reads are on time, instead of by one step per read. Rounded by where now
	// falls in a sync interval rather than down: a share of less than one request is then
	// taken as often as it adds up to one, and the limit's last requests are admitted, not left.
	grown := min(1, float64(max(0, now-ownAt))/float64(horizon))
	dither := float64(now%sync) / float64(sync)
	return int64(others + left - math.Floor(left*grown/float64(active)+dither))
}

// noteOwn records the region's count of key as read at now, for remote's share: st is its
// state, of a window of period. The table's lock is held.
func (r *Region) noteOwn(key string, st *algorithm.State, period, now int64) {
	rk := r.table.keys[key]
	if rk == nil {
		return
	}
	rk.own, rk.ownAt = [2]windowCount{{st.T, st.V}, {st.T - period, st.W}}, now
}

// unseen is how long the peer's admissions have gone unseen by the time a report now could
// arrive: sync interval + one-way delay; since its last report arrived, plus the age that
// report had on arrival, when that is longer (a silent or late peer: its last rate is assumed
// meanwhile). Delay and age are as observed (staleness), not as configured. Never more than
// the window so far.
func (r *Region) unseen(pe *peer, now, sync, start int64) int64 {
	d := max(pe.delay.Load(), pe.stale.delay.Load())
	u := sync + d
	if h := pe.fromPeer.Load(); h > 0 {
		u = max(u, now-h+d+pe.stale.age.Load())
	}
	return min(u, now-start)
}

// receive merges a peer's report.
func (r *Region) receive(pi int, counts []entry, now int64) {
	t := &r.table
	t.mu.Lock()
	for i := range counts {
		e := &counts[i]
		rk := t.keys[string(e.key)]
		if rk == nil {
			rk = &remoteKey{per: make([]peerCount, t.peers)}
			t.keys[string(e.key)] = rk
		}
		pc := &rk.per[pi]
		pc.observe(e.start, e.count)
		if e.rate >= 0 {
			pc.rate = e.rate
		}
		// A report read late from the inbox must not make the key look older than it is.
		rk.updated = max(rk.updated, now)
	}
	t.mu.Unlock()
}

// entry is one reported count, as the sync carries it.
type entry struct {
	key   []byte
	start int64
	count int64
	rate  float64 // < 0: not reported with this count
}
