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
// unless turned off, the reservation of their in-flight demand, rounded up.
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
	sync := r.cfg.Sync.Microseconds()
	var sum float64
	for j := range rk.per {
		pc := &rk.per[j]
		sum += float64(pc.count(start))
		if p.Kind == algorithm.SlidingWindowCounter {
			f := float64(now-start) / float64(period)
			sum += float64(pc.count(start-period)) * (1 - f)
		}
		if r.cfg.NoReservation || pc.rate <= 0 {
			continue
		}
		sum += pc.rate * float64(r.unseen(r.peers[j], now, sync, start)) / 1e6
	}
	t.mu.RUnlock()
	return int64(math.Ceil(sum - 1e-9))
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
