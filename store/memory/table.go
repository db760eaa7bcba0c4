package memory

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/algorithm"
)

// A stripe's keys live in an open-addressing hash table of entry pointers, probed linearly,
// which readers search without a lock: a slot only ever goes from nil to an entry, from an
// entry to the tombstone, and from the tombstone to an entry, each change one atomic store made
// under the stripe's lock, and a full table is replaced by a new one rather than changed in
// place. A reader therefore sees a key it looks for or passes over it to a nil slot; either way
// what it found is confirmed under the entry's lock (removed entries are looked up again) and
// a miss is confirmed under the stripe's lock. An entry carries its key, held in the same
// allocation for all but very long keys, so a key costs one object and an 8-byte slot (against
// a map's slot, a string header, the key and the entry: 146 → ~128 bytes a key).

// shard is a stripe of keys. Lock order: a shard's mu, then an entry's mu, never the other way
// while waiting (the sweep only tries entry locks), so a batch holding entries may add a key.
type shard struct {
	tab   atomic.Pointer[table] // replaced, never changed but for its slots, under mu
	mu    sync.Mutex            // guards what follows and every change to tab
	count int                   // live entries in tab
	tombs int                   // tombstones in tab
	seed  maphash.Seed          // the store's, to place keys when the table is rebuilt
	_     [24]byte              // a stripe per cache line: locking one does not bounce the next
}

// table is a power-of-two array of slots.
type table struct {
	slots []atomic.Pointer[entry]
	mask  uint64
}

// minSlots is a new or emptied stripe's table size.
const minSlots = 8

// tombstone marks a slot whose entry was swept: a probe goes on past it, an insert may reuse
// it. Compared by address only.
var tombstone = new(entry)

func newTable(slots int) *table {
	return &table{slots: make([]atomic.Pointer[entry], slots), mask: uint64(slots - 1)}
}

// slotsFor is the table size that holds n keys at a load of at most a half.
func slotsFor(n int) int {
	if n < minSlots/2 {
		return minSlots
	}
	return 1 << bits.Len(uint(2*n-1))
}

// init gives the stripe its first, empty table.
func (sh *shard) init(seed maphash.Seed) {
	sh.seed = seed
	sh.tab.Store(newTable(minSlots))
}

// find returns key's entry in t, or nil. The stripe's low hash bits chose the stripe, so the
// table is indexed by the ones above them.
func (t *table) find(key []byte, h uint64) *entry {
	for i := (h >> 8) & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].Load()
		if e == nil {
			return nil
		}
		if e != tombstone && e.key == string(key) {
			return e
		}
	}
}

// acquire returns key's entry, locked and live. When the stripe has none it adds a fresh one
// if create is set, else returns nil. h is the key's hash.
func (sh *shard) acquire(key []byte, h uint64, create bool) *entry {
	e := sh.tab.Load().find(key, h)
	for {
		if e != nil {
			e.mu.Lock()
			if e.idleAt != removed {
				return e
			}
			e.mu.Unlock() // swept since it was found: look again
		}
		if e = sh.slowEntry(key, h, create); e == nil {
			return nil
		}
	}
}

// slowEntry finds key under the stripe's lock, or else adds a fresh entry if create is set.
func (sh *shard) slowEntry(key []byte, h uint64, create bool) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.tab.Load().find(key, h); e != nil || !create {
		return e
	}
	e := newEntry(key)
	sh.put(e, h)
	return e
}

// insert adds key with the committed state st, unless the stripe holds it already (another op
// added it since the caller looked), and reports whether it did.
func (sh *shard) insert(key []byte, h uint64, st *algorithm.State, idleAt int64) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.tab.Load().find(key, h) != nil {
		return false
	}
	e := newEntry(key)
	e.save(st, idleAt) // not yet reachable: no lock needed
	sh.put(e, h)
	return true
}

// put adds e, whose key the stripe does not hold, growing the table first when live keys and
// tombstones would fill more than three quarters of it. The stripe is locked.
func (sh *shard) put(e *entry, h uint64) {
	t := sh.tab.Load()
	if 4*(sh.count+sh.tombs+1) > 3*len(t.slots) {
		t = sh.rebuild(sh.count + 1)
	}
	for i := (h >> 8) & t.mask; ; i = (i + 1) & t.mask {
		switch t.slots[i].Load() {
		case tombstone:
			sh.tombs--
		case nil:
		default:
			continue
		}
		t.slots[i].Store(e)
		sh.count++
		return
	}
}

// rebuild publishes a new table sized for n keys holding the live entries, and returns it.
// Readers of the old one still find every entry it held. The stripe is locked.
func (sh *shard) rebuild(n int) *table {
	old := sh.tab.Load()
	t := newTable(slotsFor(n))
	for i := range old.slots {
		e := old.slots[i].Load()
		if e == nil || e == tombstone {
			continue
		}
		j := (maphash.String(sh.seed, e.key) >> 8) & t.mask
		for t.slots[j].Load() != nil {
			j = (j + 1) & t.mask
		}
		t.slots[j].Store(e)
	}
	sh.tab.Store(t)
	sh.tombs = 0
	return t
}

// sweep drops the stripe's entries idle at now and not in use (the lock is only tried), and
// rebuilds the table once a quarter of it is tombstones or it is eight times too large.
func (sh *shard) sweep(now int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	for i := range t.slots {
		e := t.slots[i].Load()
		if e == nil || e == tombstone || !e.mu.TryLock() {
			continue
		}
		if e.idleAt <= now {
			e.idleAt = removed
			t.slots[i].Store(tombstone)
			sh.count--
			sh.tombs++
		}
		e.mu.Unlock()
	}
	if 4*sh.tombs > len(t.slots) || (len(t.slots) > minSlots && 8*sh.count < len(t.slots)) {
		sh.rebuild(sh.count)
	}
}

// entries calls f with every key of the stripe and its entry. The stripe is locked.
func (sh *shard) entries(f func(k string, e *entry)) {
	t := sh.tab.Load()
	for i := range t.slots {
		if e := t.slots[i].Load(); e != nil && e != tombstone {
			f(e.key, e)
		}
	}
}

// withKey is an entry with room for its key in the same allocation. A is a byte array.
type withKey[A any] struct {
	e entry
	k A
}

// newEntry returns a fresh entry for key. Key lengths are rounded so that entry and key fill a
// size class of Go's allocator (64 + 48 bytes is 112): one object a key, none of it wasted but
// the rounding. Keys past 256 bytes (bucket keys are bounded, and rarely that long) take an
// allocation of their own.
func newEntry(key []byte) *entry {
	switch n := len(key); {
	case n <= 16:
		return newWithKey[[16]byte](key)
	case n <= 32:
		return newWithKey[[32]byte](key)
	case n <= 48:
		return newWithKey[[48]byte](key)
	case n <= 64:
		return newWithKey[[64]byte](key)
	case n <= 80:
		return newWithKey[[80]byte](key)
	case n <= 96:
		return newWithKey[[96]byte](key)
	case n <= 128:
		return newWithKey[[128]byte](key)
	case n <= 192:
		return newWithKey[[192]byte](key)
	case n <= 256:
		return newWithKey[[256]byte](key)
	}
	return &entry{key: string(key)}
}

// newWithKey allocates an entry and key together. The key string points into the allocation,
// which the entry's address keeps alive; it is never written after this.
func newWithKey[A any](key []byte) *entry {
	w := new(withKey[A])
	b := unsafe.Slice((*byte)(unsafe.Pointer(&w.k)), unsafe.Sizeof(w.k))
	n := copy(b, key)
	w.e.key = unsafe.String(unsafe.SliceData(b), n)
	return &w.e
}
