package memory

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// TestNewEntryIsOneObject checks what the memory figure rests on: an entry is 72 bytes, and an
// entry with its key is one allocation up to the longest length newEntry rounds.
func TestNewEntryIsOneObject(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Fatalf("entry is %d bytes; newEntry's lengths assume 64", n)
	}
	for _, c := range []struct {
		length, allocs int
	}{
		{0, 1}, {1, 1}, {16, 1}, {17, 1}, {40, 1}, {48, 1}, {49, 1}, {96, 1}, {128, 1}, {192, 1},
		{256, 1}, {257, 2}, {1000, 2},
	} {
		t.Run(fmt.Sprint(c.length), func(t *testing.T) {
			key := []byte(strings.Repeat("k", c.length))
			var e *entry
			if got := testing.AllocsPerRun(10, func() { e = newEntry(key) }); int(got) != c.allocs {
				t.Errorf("%v allocations, want %d", got, c.allocs)
			}
			for i := range key {
				key[i] = 'x' // the entry's key must be a copy
			}
			if e.key != strings.Repeat("k", c.length) {
				t.Errorf("key %q, want %d k's", e.key, c.length)
			}
		})
	}
}

// TestTableMatchesAMap drives one stripe through random adds, sweeps and lookups, and checks
// it against a map: every live key found, every swept one not, counts and load as promised.
func TestTableMatchesAMap(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	var sh shard
	seed := maphash.MakeSeed()
	sh.init(seed)
	model := map[string]int64{} // key → idleAt
	hash := func(k string) uint64 { return maphash.String(seed, k) }
	now := int64(0)
	for step := range 20_000 {
		switch n := r.IntN(100); {
		case n < 70:
			k := fmt.Sprintf("key%d", r.IntN(3000))
			idle := now + int64(1+r.IntN(50))
			st := algorithm.State{T: idle}
			added := sh.insert([]byte(k), hash(k), &st, idle)
			if _, live := model[k]; added == live {
				t.Fatalf("step %d: insert %q added %v with the key live %v", step, k, added, live)
			}
			if added {
				model[k] = idle
			}
		case n < 72:
			now += int64(r.IntN(30))
			sh.sweep(now)
			for k, idle := range model {
				if idle <= now {
					delete(model, k)
				}
			}
		default:
			k := fmt.Sprintf("key%d", r.IntN(3000))
			e := sh.tab.Load().find([]byte(k), hash(k))
			idle, live := model[k]
			if (e != nil) != live || (e != nil && (e.key != k || e.t != idle)) {
				t.Fatalf("step %d: find %q = %v, want live %v with state %d", step, k, e, live, idle)
			}
		}
		tab := sh.tab.Load()
		if sh.count != len(model) || 4*(sh.count+sh.tombs) > 3*len(tab.slots) {
			t.Fatalf("step %d: %d keys and %d tombstones in %d slots, want %d keys at most 3/4 full", step, sh.count, sh.tombs, len(tab.slots), len(model))
		}
	}
	n := 0
	sh.entries(func(k string, e *entry) {
		n++
		if model[k] != e.idleAt {
			t.Errorf("entries lists %q idle at %d, want %d", k, e.idleAt, model[k])
		}
	})
	if n != len(model) {
		t.Errorf("entries listed %d keys, want %d", n, len(model))
	}
	// Every key swept: the table shrinks back.
	sh.sweep(now + 1000)
	if sh.count != 0 || len(sh.tab.Load().slots) != minSlots {
		t.Errorf("after sweeping everything: %d keys in %d slots, want 0 in %d", sh.count, len(sh.tab.Load().slots), minSlots)
	}
}

// TestConcurrentExactWhileTablesGrow checks a few keys from many goroutines while another adds
// and sweeps thousands of keys, so that readers probe tables being rebuilt, grown and shrunk
// under them: every admitted check must be counted on the one live entry of its key.
func TestConcurrentExactWhileTablesGrow(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	const limit = 1_000_000_000
	p := params(t, algorithm.FixedWindow, limit, time.Hour)
	churn := params(t, algorithm.FixedWindow, 10, time.Second)
	const churnKeys = 30_000 // ~120 a stripe: tables grow past 8 slots and shrink back
	var churned atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		res := make([]algorithm.Result, 1)
		for i := range churnKeys {
			s.Apply(t.Context(), &store.Batch{Ops: []store.Op{op(fmt.Sprintf("churn%d", i), churn, 1)}}, res)
			if i%10_000 == 9_999 {
				c.Add(2 * time.Second) // the churn keys go idle; the hot keys do not
				s.Sweep()
			}
			churned.Add(1)
		}
	})
	var admitted [4]atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			res := make([]algorithm.Result, 2)
			for i := 0; i < 100 || churned.Load() < churnKeys; i++ {
				k := (g + i) % 4
				b := store.Batch{Ops: []store.Op{op(fmt.Sprintf("hot%d", k), p, 1)}}
				if i%2 == 1 {
					b.Ops = append(b.Ops, op(fmt.Sprintf("hot%d", (k+1)%4), p, 0))
				}
				s.Apply(t.Context(), &b, res[:len(b.Ops)])
				if !res[0].Allowed {
					t.Errorf("hot%d denied", k)
					return
				}
				admitted[k].Add(1)
			}
		})
	}
	wg.Wait()
	for k := range admitted {
		res := apply(t, s, op(fmt.Sprintf("hot%d", k), p, 0))
		if used := limit - res[0].Remaining; used != admitted[k].Load() {
			t.Errorf("hot%d counted %d of %d admitted checks: some were counted on a lost entry", k, used, admitted[k].Load())
		}
	}
}
