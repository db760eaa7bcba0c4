package region

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/policy"
)

// rateTau is the time constant of the rate estimate (µs): long enough to smooth the Poisson
// noise of a few requests per sync, short enough that a region that stopped admitting soon
// stops being reserved for.
const rateTau = 500_000

// directoryEvery is how many syncs pass between full listings of the store's global keys: the
// keys this node consumed are read every sync; a listing also finds those only other nodes of
// the region touched, and the state a restart kept.
const directoryEvery = 50

// local is this region's side of the sync: the global keys it tracks, their last read state
// and rate, and a sequence number of changes that each peer's delivery is measured against.
type local struct {
	// shards note the keys consumed since the last read, apart from l.mu, which the sync holds
	// while it walks every key: a check takes only its key's shard, briefly.
	shards [touchShards]touchShard
	seed   maphash.Seed

	// reads numbers the reads: a tracked key touched during read n holds n in its shard, so
	// that the prune after that read keeps it (its last state read may predate the touch).
	reads atomic.Uint32

	mu    sync.Mutex
	keys  map[string]*localKey
	seq   uint64
	ticks int
}

// touchShards is how many locks checks of global keys spread over.
const touchShards = 32

// touchShard is the part of the touched keys whose hash falls in it.
type touchShard struct {
	mu      sync.Mutex
	touched map[string]*ruleInfo // consumed since the last read, not yet tracked
	tracked map[string]uint32    // in l.keys, read every sync anyway: the read it was last touched in
	_       [64]byte             // keeps neighbouring shards' locks off one cache line
}

// localKey is one global key as last read from the region's store.
type localKey struct {
	info     *ruleInfo
	period   int64
	st       algorithm.State
	readAt   int64
	rate     float64 // per second
	sentRate float64
	seq      uint64 // of its last change
}

func (l *local) init() {
	l.seed = maphash.MakeSeed()
	for i := range l.shards {
		l.shards[i].touched = map[string]*ruleInfo{}
		l.shards[i].tracked = map[string]uint32{}
	}
	l.keys = map[string]*localKey{}
}

func (l *local) shard(key string) *touchShard {
	return &l.shards[maphash.String(l.seed, key)%touchShards]
}

// touch notes that key, of a global rule, was consumed: the next read includes it. A key
// already tracked is read every sync anyway; for another, the string is made once per sync.
func (l *local) touch(key []byte, info *ruleInfo) {
	sh := &l.shards[maphash.Bytes(l.seed, key)%touchShards]
	n := l.reads.Load()
	sh.mu.Lock()
	if at, ok := sh.tracked[string(key)]; ok {
		if at != n {
			sh.tracked[string(key)] = n
		}
	} else if _, ok := sh.touched[string(key)]; !ok {
		sh.touched[string(key)] = info
	}
	sh.mu.Unlock()
}

// track notes that key is in l.keys, for touch.
func (l *local) track(key string) {
	sh := l.shard(key)
	sh.mu.Lock()
	sh.tracked[key] = l.reads.Load()
	sh.mu.Unlock()
}

// untrackIdle stops tracking key unless it was touched during the current read, and reports
// whether it did.
func (l *local) untrackIdle(key string) bool {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.tracked[key] == l.reads.Load() {
		return false
	}
	delete(sh.tracked, key)
	return true
}

// read reads the region's counts of every tracked key from the store, updates their rates,
// and numbers what changed. It returns the highest change number.
func (r *Region) read(ctx context.Context, now int64) (uint64, error) {
	l := &r.local
	rs := r.rulesNow()
	l.reads.Add(1)
	want := map[string]*ruleInfo{}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for k, info := range sh.touched {
			want[k] = info
		}
		clear(sh.touched)
		sh.mu.Unlock()
	}
	l.mu.Lock()
	for k, lk := range l.keys {
		if _, ok := want[k]; !ok {
			want[k] = lk.info
		}
	}
	l.ticks++
	list := l.ticks%directoryEvery == 1
	l.mu.Unlock()
	if list {
		for head, info := range rs.byHead {
			if info.mode != policy.RegionGlobal {
				continue
			}
			err := r.reader.Keys(ctx, []byte(head), func(k []byte) {
				if string(headOf(k)) == head {
					if _, ok := want[string(k)]; !ok {
						want[string(k)] = info
					}
				}
			})
			if err != nil {
				return 0, fmt.Errorf("list global keys of %s: %w", info.name, err)
			}
		}
	}
	byKind := map[algorithm.Kind][][]byte{}
	for k, info := range want {
		// The rule may have changed since: the policy in force says what the key is.
		if cur := rs.byHead[string(headOf([]byte(k)))]; cur != nil {
			info = cur
		}
		byKind[info.kind] = append(byKind[info.kind], []byte(k))
	}
	for kind, keys := range byKind {
		states := make([]algorithm.State, len(keys))
		if err := r.reader.ReadStates(ctx, kind, keys, states); err != nil {
			return 0, fmt.Errorf("read global counts: %w", err)
		}
		l.mu.Lock()
		for i, k := range keys {
			l.update(k, want[string(k)], rs, &states[i], now)
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t := &r.table
	t.mu.Lock()
	for k, lk := range l.keys {
		r.noteOwn(k, &lk.st, max(lk.info.period, 1), now)
	}
	t.mu.Unlock()
	return l.seq, nil
}

// update merges a key's fresh state. l.mu is held.
func (l *local) update(k []byte, info *ruleInfo, rs *ruleSet, st *algorithm.State, now int64) {
	if cur := rs.byHead[string(headOf(k))]; cur != nil {
		info = cur
	}
	lk := l.keys[string(k)]
	if lk == nil {
		if st.T == 0 {
			return // never held, or idle
		}
		lk = &localKey{info: info, readAt: now - int64(rateTau)}
		l.keys[string(k)] = lk
		l.track(string(k))
	}
	lk.info = info
	period := max(info.period, 1)
	// What the region admitted since the last read: within a window, the count's growth; across
	// a roll, the rest of the last window (a sliding counter keeps it in W) and the new one.
	var delta int64
	switch {
	case st.T == 0:
	case st.T == lk.st.T:
		delta = st.V - lk.st.V
	case info.kind == algorithm.SlidingWindowCounter && lk.st.T != 0 && st.T-lk.st.T <= 2*period:
		if st.T-lk.st.T < 2*period {
			delta = st.W - lk.st.V
		}
		delta += st.V
	default:
		delta = st.V
	}
	delta = max(delta, 0)
	dt := now - lk.readAt
	if dt > 0 {
		a := 1 - math.Exp(-float64(dt)/rateTau)
		lk.rate += a * (float64(delta)*1e6/float64(dt) - lk.rate)
		if lk.rate < 0.05 {
			lk.rate = 0
		}
	}
	lk.readAt = now
	changed := st.T != lk.st.T || st.V != lk.st.V || st.W != lk.st.W
	if d := math.Abs(lk.rate - lk.sentRate); d > 0.5+0.1*lk.sentRate || (lk.rate == 0) != (lk.sentRate == 0) {
		changed = true
	}
	if st.T != 0 {
		lk.st = *st
	}
	if changed {
		l.seq++
		lk.seq = l.seq
		lk.sentRate = lk.rate
	}
}

// prune drops the keys whose windows are over and that no longer admit, once every peer has
// their last change (acked): until then a peer would go on reserving for their old rate.
func (r *Region) prune(acked uint64, now int64) {
	l := &r.local
	l.mu.Lock()
	for k, lk := range l.keys {
		// A key touched since the read began may have consumed after its state was read:
		// it stays for the next read.
		if lk.rate == 0 && lk.seq <= acked && now >= lk.st.T+2*max(lk.info.period, 1) && l.untrackIdle(k) {
			delete(l.keys, k)
		}
	}
	l.mu.Unlock()
}

// outbox returns the counts that changed after change number from, as the sync sends them.
func (r *Region) outbox(from uint64) []entry {
	l := &r.local
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []entry
	for k, lk := range l.keys {
		if lk.seq <= from {
			continue
		}
		out = append(out, entry{key: []byte(k), start: lk.st.T, count: lk.st.V, rate: lk.sentRate})
		if lk.info.kind == algorithm.SlidingWindowCounter && lk.st.W > 0 {
			out = append(out, entry{key: []byte(k), start: lk.st.T - lk.info.period, count: lk.st.W, rate: -1})
		}
	}
	return out
}
