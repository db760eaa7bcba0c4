package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

const t0 = int64(1_800_000_000_000_000)

// fakeClock is the only fake these tests use: time.
type fakeClock struct{ now atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.now.Store(t0)
	return c
}
func (c *fakeClock) Now() int64          { return c.now.Load() }
func (c *fakeClock) Add(d time.Duration) { c.now.Add(d.Microseconds()) }
func newStore(c *fakeClock, o ...Option) *Store {
	return New(append([]Option{WithClock(c.Now), WithSweepInterval(0)}, o...)...)
}

func params(t testing.TB, k algorithm.Kind, n int64, period time.Duration) *algorithm.Params {
	t.Helper()
	p, err := algorithm.NewParams(k, n, 0, period)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func apply(t testing.TB, s *Store, ops ...store.Op) []algorithm.Result {
	t.Helper()
	res := make([]algorithm.Result, len(ops))
	if _, err := s.Apply(context.Background(), &store.Batch{Ops: ops}, res); err != nil {
		t.Fatal(err)
	}
	return res
}

func op(k string, p *algorithm.Params, cost int64) store.Op {
	return store.Op{Key: []byte(k), Params: p, Cost: cost}
}

func TestAllOrNothing(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	big := params(t, algorithm.TokenBucket, 10, time.Second)
	small := params(t, algorithm.FixedWindow, 2, time.Minute)

	// Two requests fit both limits; the third is denied by the small one and must not
	// consume from the big one.
	for i := range 3 {
		res := apply(t, s, op("big", big, 1), op("small", small, 1))
		wantAllowed := i < 2
		if res[1].Allowed != wantAllowed {
			t.Fatalf("request %d: small allowed=%v", i, res[1].Allowed)
		}
		if !res[0].Allowed {
			t.Fatalf("request %d: big denied", i)
		}
		if !wantAllowed && res[0].Remaining != 8 {
			t.Fatalf("denied request consumed from big: remaining %d, want 8", res[0].Remaining)
		}
	}
	if r := apply(t, s, op("big", big, 0))[0]; r.Remaining != 8 {
		t.Fatalf("big remaining %d after a denied request, want 8", r.Remaining)
	}
}

func TestShadowNeverDenies(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	real := params(t, algorithm.FixedWindow, 5, time.Minute)
	tight := params(t, algorithm.FixedWindow, 1, time.Minute)
	shadow := func(k string, p *algorithm.Params) store.Op { o := op(k, p, 1); o.Shadow = true; return o }
	apply(t, s, op("real", real, 1), shadow("shadow", tight))
	res := apply(t, s, op("real", real, 1), shadow("shadow", tight))
	if res[1].Allowed {
		t.Fatal("shadow limit of 1 allowed a second request")
	}
	if !res[0].Allowed || res[0].Remaining != 3 {
		t.Fatalf("a shadow denial blocked the real limit: %+v", res[0])
	}
}

func TestSameKeyTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.FixedWindow, 3, time.Minute)
	// Two ops on one new key: together 4 > 3, so the second denies and neither consumes.
	res := apply(t, s, op("k", p, 2), op("k", p, 2))
	if !res[0].Allowed || res[1].Allowed {
		t.Fatalf("results %+v", res)
	}
	if r := apply(t, s, op("k", p, 0))[0]; r.Remaining != 3 {
		t.Fatalf("remaining %d after a denied batch, want 3", r.Remaining)
	}
	// A look and a spend on one new key: the spend must be kept.
	apply(t, s, op("n", p, 0), op("n", p, 1))
	if r := apply(t, s, op("n", p, 0))[0]; r.Remaining != 2 {
		t.Fatalf("remaining %d, want 2", r.Remaining)
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.FixedWindow, 10, time.Hour)
	b := store.Batch{Ops: []store.Op{op("k", p, 3)}, IdempotencyKey: []byte("req-1"), IdempotencyTTL: 5 * time.Minute}
	res := make([]algorithm.Result, 1)
	for i := range 3 {
		replayed, _ := s.Apply(context.Background(), &b, res)
		if replayed != (i > 0) || res[0].Remaining != 7 {
			t.Fatalf("try %d: replayed=%v remaining=%d", i, replayed, res[0].Remaining)
		}
	}
	c.Add(6 * time.Minute)
	if replayed, _ := s.Apply(context.Background(), &b, res); replayed || res[0].Remaining != 4 {
		t.Fatalf("after the TTL: replayed=%v remaining=%d, want a new decision with 4 left", replayed, res[0].Remaining)
	}
}

// TestConcurrentExact runs 64 goroutines on one key with the clock stopped: every exact
// algorithm must admit exactly its capacity, no more (race) and no less (lost updates).
func TestConcurrentExact(t *testing.T) {
	t.Parallel()
	for _, k := range []algorithm.Kind{algorithm.TokenBucket, algorithm.GCRA, algorithm.LeakyBucket, algorithm.FixedWindow, algorithm.SlidingWindowLog} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := newStore(c)
			defer s.Close()
			p := params(t, k, 500, time.Hour)
			other := params(t, algorithm.TokenBucket, 1_000_000, time.Second)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := make([]algorithm.Result, 2)
					for range 40 {
						b := store.Batch{Ops: []store.Op{op("hot", p, 1), op(fmt.Sprintf("g%d", g), other, 1)}}
						s.Apply(context.Background(), &b, res)
						if res[0].Allowed && res[1].Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got := admitted.Load(); got != 500 {
				t.Fatalf("admitted %d of 2560 on a limit of 500", got)
			}
		})
	}
}

// TestConcurrentExactWhileSwept runs checks while another goroutine sweeps without pause, the
// clock moving a window on between rounds: a check that finds an entry the sweep just removed
// must look again and count on the new one, so every round admits exactly the limit.
func TestConcurrentExactWhileSwept(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.FixedWindow, 50, time.Second)
	stop := make(chan struct{})
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		for {
			select {
			case <-stop:
				return
			default:
				s.Sweep()
			}
		}
	}()
	defer func() { close(stop); <-swept }()
	for round := range 20 {
		var single, paired atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]algorithm.Result, 2)
				for range 10 {
					s.Apply(context.Background(), &store.Batch{Ops: []store.Op{op("one", p, 1)}}, res[:1])
					if res[0].Allowed {
						single.Add(1)
					}
					b := store.Batch{Ops: []store.Op{op(fmt.Sprintf("pair%d", g%2), p, 1), op("pair", p, 1)}}
					s.Apply(context.Background(), &b, res)
					if res[0].Allowed && res[1].Allowed {
						paired.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if single.Load() != 50 || paired.Load() != 50 {
			t.Fatalf("round %d: admitted %d on the single key and %d on the pair, want 50 and 50", round, single.Load(), paired.Load())
		}
		c.Add(time.Second) // every key idle: the sweep removes them while the next round runs
	}
}

// TestSweptKeyComesBackFresh sweeps a few keys of many, which leaves them dead in the stripe's
// read map until enough die: a check of one must start from a fresh state, and every count
// must leave them out.
func TestSweptKeyComesBackFresh(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	long := params(t, algorithm.TokenBucket, 10, time.Hour)
	short := params(t, algorithm.TokenBucket, 10, time.Second)
	for i := range 5000 {
		apply(t, s, op(fmt.Sprintf("long%d", i), long, 1))
	}
	for i := range 50 {
		apply(t, s, op(fmt.Sprintf("short%d", i), short, 3))
	}
	c.Add(2 * time.Second) // the short keys refill and go idle; the long ones do not
	s.Sweep()
	if n := s.Len(); n != 5000 {
		t.Fatalf("after sweeping the idle keys: Len = %d, want 5000", n)
	}
	if r := apply(t, s, op("short7", short, 1)); r[0].Remaining != 9 {
		t.Fatalf("a swept key: remaining %d, want 9 (fresh)", r[0].Remaining)
	}
	if r := apply(t, s, op("long7", long, 1)); r[0].Remaining != 8 {
		t.Fatalf("a kept key: remaining %d, want 8", r[0].Remaining)
	}
	if n := s.Len(); n != 5001 {
		t.Fatalf("after the swept key came back: Len = %d, want 5001", n)
	}
	path := filepath.Join(t.TempDir(), "snap")
	if err := s.WriteSnapshot(path); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(c, WithSnapshot(path, 0))
	defer s2.Close()
	if n := s2.Len(); n != 5001 {
		t.Fatalf("snapshot of the store: %d keys, want 5001", n)
	}
}

// TestUnknownKeysLeaveNothing looks at, is denied on and resets keys the store does not hold:
// none of it may add a key, or a flood of looks would fill memory until the next sweep.
func TestUnknownKeysLeaveNothing(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.TokenBucket, 10, time.Second)
	for i := range 100 {
		k := fmt.Sprintf("k%d", i)
		if r := apply(t, s, op(k, p, 0)); !r[0].Allowed || r[0].Remaining != 10 {
			t.Fatalf("a look at an unknown key: %+v, want allowed with 10 left", r[0])
		}
		if r := apply(t, s, op(k, p, 11)); r[0].Allowed {
			t.Fatalf("cost 11 on a limit of 10 allowed")
		}
		if err := s.Reset(context.Background(), [][]byte{[]byte(k)}); err != nil {
			t.Fatal(err)
		}
		if r := apply(t, s, op(k, p, 0), op(k+"-other", p, 0)); !r[0].Allowed || !r[1].Allowed {
			t.Fatalf("a look at two unknown keys denied")
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after looks, denials and resets of unknown keys, want 0", n)
	}
	apply(t, s, op("k1", p, 1))
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d after one committed check, want 1", n)
	}
}

func TestIdleKeysExpire(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.TokenBucket, 10, time.Second)
	w := params(t, algorithm.SlidingWindowCounter, 10, time.Second)
	for i := range 1000 {
		apply(t, s, op(fmt.Sprintf("k%d", i), p, 1), op(fmt.Sprintf("w%d", i), w, 1))
	}
	if n := s.Len(); n != 2000 {
		t.Fatalf("Len = %d, want 2000", n)
	}
	c.Add(1500 * time.Millisecond) // buckets full again; counters still weigh in the next window
	s.Sweep()
	if n := s.Len(); n != 1000 {
		t.Fatalf("after the buckets refilled: Len = %d, want the 1000 window keys", n)
	}
	c.Add(2 * time.Second)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("after everything went idle: Len = %d, want 0", n)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	c := newClock()
	path := filepath.Join(t.TempDir(), "state.snap")
	s := newStore(c, WithSnapshot(path, 0))
	kinds := map[string]*algorithm.Params{}
	for _, k := range algorithm.Kinds {
		kinds[k.String()] = params(t, k, 10, time.Minute)
		apply(t, s, op(k.String(), kinds[k.String()], 4))
	}
	b := store.Batch{Ops: []store.Op{op("idem", kinds["gcra"], 1)}, IdempotencyKey: []byte("r1"), IdempotencyTTL: time.Minute}
	s.Apply(context.Background(), &b, make([]algorithm.Result, 1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := newStore(c, WithSnapshot(path, 0))
	defer s2.Close()
	for name, p := range kinds {
		if r := apply(t, s2, op(name, p, 0))[0]; r.Remaining != 6 {
			t.Errorf("%s after restart: remaining %d, want 6", name, r.Remaining)
		}
	}
	res := make([]algorithm.Result, 1)
	if replayed, _ := s2.Apply(context.Background(), &b, res); !replayed || res[0].Remaining != 9 {
		t.Errorf("idempotent replay after restart: replayed=%v remaining=%d", replayed, res[0].Remaining)
	}
}

func TestDamagedSnapshot(t *testing.T) {
	t.Parallel()
	c := newClock()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.snap")
	s := newStore(c, WithSnapshot(good, 0))
	p := params(t, algorithm.FixedWindow, 100, time.Hour)
	for i := range 200 {
		apply(t, s, op(fmt.Sprintf("k%03d", i), p, 7))
	}
	s.Close()
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		data    []byte
		minKeys int // at least this many sound records survive
		maxKeys int
		logged  string
	}{
		{"truncated in the middle", data[:len(data)/2], 50, 150, "truncated"},
		{"flipped byte", flip(data, len(data)/3), 199, 199, "damaged"}, // the record it hit
		{"no end record", data[:len(data)-8], 200, 200, "truncated"},   // the end record is 8 bytes
		{"bad header", append([]byte("NOT-A-SNAPSHOT!!!"), data[17:]...), 0, 0, "bad header"},
		{"empty file", nil, 0, 0, "bad header"},
		{"huge length", append([]byte(snapshotMagic), 0xff, 0xff, 0xff, 0xff, 0x0f), 0, 0, "claims"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			s := newStore(c, WithSnapshot(path, 0), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			defer s.Close()
			if n := s.Len(); n < tc.minKeys || n > tc.maxKeys {
				t.Errorf("loaded %d keys, want %d..%d", n, tc.minKeys, tc.maxKeys)
			}
			if !strings.Contains(logs.String(), tc.logged) || !strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("log %q does not report %q", logs.String(), tc.logged)
			}
			// What was loaded is right, and the store works.
			if r := apply(t, s, op("k000", p, 0))[0]; r.Remaining != 100 && r.Remaining != 93 {
				t.Errorf("k000 remaining %d", r.Remaining)
			}
		})
	}
}

// frame is where one record of a snapshot lies, for tests that damage it.
type frameSpan struct {
	off, payload, end int // the length's offset, the payload's, and the next frame's
	key               string
}

// framesOf lists the records of a sound snapshot.
func framesOf(t *testing.T, data []byte) []frameSpan {
	t.Helper()
	var out []frameSpan
	for off := len(snapshotMagic); off < len(data); {
		size, w := binary.Uvarint(data[off:])
		if w <= 0 || off+w+int(size)+4 > len(data) {
			t.Fatalf("no sound frame at byte %d", off)
		}
		payload := data[off+w : off+w+int(size)]
		next := off + w + int(size) + 4
		f := frameSpan{off: off, payload: off + w, end: next}
		if payload[0] != recEnd {
			k, w := binary.Uvarint(payload[1:])
			f.key = string(payload[1+w : 1+w+int(k)])
		}
		out = append(out, f)
		off = next
	}
	return out
}

// TestDamagedRecordsAreSkipped: damage in one record, wherever it falls (payload, checksum, or
// the length that frames it), costs that record only: every other is restored, the skipped
// count is logged, and the damaged file is kept aside rather than overwritten.
func TestDamagedRecordsAreSkipped(t *testing.T) {
	t.Parallel()
	c := newClock()
	dir := t.TempDir()
	sound := filepath.Join(dir, "sound.snap")
	s := newStore(c, WithSnapshot(sound, 0))
	p := params(t, algorithm.FixedWindow, 100, time.Hour)
	const keys = 200
	for i := range keys {
		apply(t, s, op(fmt.Sprintf("k%03d", i), p, 7))
	}
	s.Close()
	data, err := os.ReadFile(sound)
	if err != nil {
		t.Fatal(err)
	}
	frames := framesOf(t, data)
	byKey := map[string]frameSpan{}
	for _, f := range frames {
		byKey[f.key] = f
	}
	end := frames[len(frames)-1]
	damage := func(edit func(b []byte)) []byte {
		b := bytes.Clone(data)
		edit(b)
		return b
	}
	cases := []struct {
		name    string
		data    []byte
		lost    []string // keys that must come back fresh
		skipped string   // the count logged
	}{
		{"payload byte", damage(func(b []byte) { b[byKey["k100"].payload+3] ^= 0x55 }), []string{"k100"}, "skipped=1"},
		{"checksum", damage(func(b []byte) { b[byKey["k100"].end-2] ^= 0xff }), []string{"k100"}, "skipped=1"},
		{"length shorter", damage(func(b []byte) { b[byKey["k100"].off] -= 3 }), []string{"k100"}, "skipped=1"},
		{"length longer", damage(func(b []byte) { b[byKey["k100"].off] += 9 }), []string{"k100"}, "skipped=1"},
		{"length of many bytes", damage(func(b []byte) { b[byKey["k100"].off] |= 0x80 }), []string{"k100"}, "skipped=1"},
		{"two records", damage(func(b []byte) {
			b[byKey["k050"].payload+1] ^= 0x01
			b[byKey["k150"].off] = 0
		}), []string{"k050", "k150"}, "skipped=2"},
		{"zeros over three records", damage(func(b []byte) {
			// A record a third into the file: three records from it stay inside it, whatever
			// order the snapshot wrote the keys in.
			first := frames[len(frames)/3]
			for i := first.off; i < first.off+3*(first.end-first.off)-5; i++ {
				b[i] = 0
			}
		}), nil, "skipped=3"}, // which keys lie there depends on map order; counted below
		{"end record", damage(func(b []byte) { b[end.payload] ^= 0x01 }), nil, "skipped=unknown"},
		// A long stretch of noise between two records (a misplaced block): all records are
		// found on the far side, and nothing is counted lost.
		{"noise", func() []byte {
			at := byKey["k100"].off
			noise := make([]byte, 1<<20)
			rand.NewChaCha8([32]byte{1}).Read(noise)
			return slices.Concat(data[:at], noise, data[at:])
		}(), nil, "skipped=0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "memory.snapshot")
			if err := os.WriteFile(path, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			s := newStore(c, WithSnapshot(path, 0), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			lost := map[string]bool{}
			for _, k := range tc.lost {
				lost[k] = true
			}
			restored := 0
			for i := range keys {
				k := fmt.Sprintf("k%03d", i)
				r := apply(t, s, op(k, p, 0))[0]
				switch {
				case r.Remaining == 93:
					restored++
					if lost[k] {
						t.Errorf("%s came back from a damaged record", k)
					}
				case r.Remaining != 100 || !lost[k] && tc.lost != nil:
					t.Errorf("%s: remaining %d after load", k, r.Remaining)
				}
			}
			wantRestored := keys - len(tc.lost)
			if tc.name == "zeros over three records" {
				wantRestored = keys - 3
			}
			if restored != wantRestored {
				t.Errorf("restored %d keys, want %d", restored, wantRestored)
			}
			log := logs.String()
			if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, tc.skipped) {
				t.Errorf("log %q does not report %q", log, tc.skipped)
			}
			// The damaged file is kept aside, byte for byte, and not overwritten by the next save.
			aside, _ := filepath.Glob(path + ".damaged-*")
			if len(aside) != 1 || !strings.Contains(log, "kept_aside="+aside[0]) {
				t.Fatalf("damaged file kept aside as %v; log %q", aside, log)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if kept, _ := os.ReadFile(aside[0]); !bytes.Equal(kept, tc.data) {
				t.Error("the file kept aside is not the damaged file")
			}
			s2 := newStore(c, WithSnapshot(path, 0))
			defer s2.Close()
			if s2.Len() != restored {
				t.Errorf("the next save holds %d keys, want the %d restored", s2.Len(), restored)
			}
		})
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x55
	return c
}

func TestPeriodicSnapshot(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.snap")
	s := New(WithSnapshot(path, 20*time.Millisecond), WithSweepInterval(0))
	defer s.Close()
	apply(t, s, op("k", params(t, algorithm.FixedWindow, 10, time.Hour), 1))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot written within 5 s at a 20 ms interval")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A crash here (no Close) leaves that file: a new store reads it.
	s2 := New(WithSnapshot(path, 0), WithSweepInterval(0))
	defer s2.Close()
	if s2.Len() != 1 {
		t.Fatalf("periodic snapshot held %d keys, want 1", s2.Len())
	}
}

func FuzzReadSnapshot(f *testing.F) {
	c := newClock()
	s := newStore(c)
	for _, k := range algorithm.Kinds {
		apply(f, s, op(k.String(), params(f, k, 10, time.Minute), 2))
	}
	slots, err := algorithm.NewParams(algorithm.Concurrency, 4, 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	slot := op("jobs", &slots, 1)
	slot.Slot, slot.SlotTTL = []byte("ls_1"), 60_000_000
	apply(f, s, slot)
	s.Apply(context.Background(), idemBatch("req-1", op("k", params(f, algorithm.GCRA, 10, time.Minute), 1)), make([]algorithm.Result, 1))
	path := filepath.Join(f.TempDir(), "seed.snap")
	if err := s.WriteSnapshot(path); err != nil {
		f.Fatal(err)
	}
	seed, _ := os.ReadFile(path)
	f.Add(seed)
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newStore(c)
		s.ReadSnapshot(bytes.NewReader(data))
		for _, k := range algorithm.Kinds {
			apply(t, s, op(k.String(), params(t, k, 10, time.Minute), 1))
		}
		apply(t, s, slot)
	})
}

// TestLookChangesNothing: looks with another limit's parameters (another tier) must not
// rewrite a key's state: the reviewer's leaky bucket admitted 46 against a bound of 10.
func TestLookChangesNothing(t *testing.T) {
	t.Parallel()
	for _, k := range []algorithm.Kind{algorithm.TokenBucket, algorithm.GCRA, algorithm.LeakyBucket} {
		c := newClock()
		s := newStore(c)
		p, _ := algorithm.NewParams(k, 10, 10, time.Hour)
		trial, _ := algorithm.NewParams(k, 10, 1, time.Hour)
		admitted := 0
		for range 5 {
			for range 20 {
				if apply(t, s, op("k", &p, 1))[0].Allowed {
					admitted++
				}
			}
			apply(t, s, op("k", &trial, 0))
		}
		if admitted != 10 {
			t.Errorf("%s: admitted %d with looks in between, want 10", k, admitted)
		}
		s.Close()
	}
}

// TestLogSurvivesAShorterTier: a look or a denial under a tier with a shorter period must not
// prune a sliding log's entries that the longer period still counts (as in Redis, which saves
// only what commits).
func TestLogSurvivesAShorterTier(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	long, _ := algorithm.NewParams(algorithm.SlidingWindowLog, 5, 0, time.Second)
	short, _ := algorithm.NewParams(algorithm.SlidingWindowLog, 1, 0, 100*time.Millisecond)
	apply(t, s, op("k", &long, 3))
	c.Add(200 * time.Millisecond)
	apply(t, s, op("k", &short, 0)) // a look
	apply(t, s, op("k", &short, 5)) // a denial (cost over capacity)
	c.Add(100 * time.Millisecond)
	if r := apply(t, s, op("k", &long, 3))[0]; r.Allowed {
		t.Fatalf("6 admitted within 1 s against a limit of 5: %+v", r)
	}
}

// idemRecords counts the idempotency records held, expired ones not yet swept included.
func (s *Store) idemRecords() int {
	n := 0
	for i := range s.idem {
		s.idem[i].mu.Lock()
		n += len(s.idem[i].m)
		s.idem[i].mu.Unlock()
	}
	return n
}

// idemBatch is an idempotent batch with its fingerprint, as the limiter builds it.
func idemBatch(id string, ops ...store.Op) *store.Batch {
	b := &store.Batch{Ops: ops, IdempotencyKey: []byte(id), IdempotencyTTL: 5 * time.Minute}
	b.IdempotencyFingerprint, _ = store.FingerprintOf(ops, nil)
	return b
}

// TestIdempotencyBoundToBatch: a key replays only the batch it was first used for; another
// cost, limit set, limit or shadow flag is refused and consumes nothing.
func TestIdempotencyBoundToBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := params(t, algorithm.FixedWindow, 10, time.Hour)
	tier := params(t, algorithm.FixedWindow, 20, time.Hour)
	first := []store.Op{op("k", p, 3), op("g", p, 1)}
	for _, tc := range []struct {
		name string
		ops  []store.Op
	}{
		{"another cost", []store.Op{op("k", p, 4), op("g", p, 1)}},
		{"a limit more", []store.Op{op("k", p, 3), op("g", p, 1), op("other", p, 1)}},
		{"a limit less", []store.Op{op("k", p, 3)}},
		{"another limit", []store.Op{op("k", tier, 3), op("g", p, 1)}},
		{"another order", []store.Op{op("g", p, 1), op("k", p, 3)}},
		{"shadow", []store.Op{op("k", p, 3), {Key: []byte("g"), Params: p, Cost: 1, Shadow: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(newClock())
			defer s.Close()
			res := make([]algorithm.Result, len(first))
			if replayed, err := s.Apply(ctx, idemBatch("req-1", first...), res); err != nil || replayed || !res[0].Allowed {
				t.Fatalf("first use: replayed=%v err=%v %+v", replayed, err, res)
			}
			res = make([]algorithm.Result, len(tc.ops))
			if replayed, err := s.Apply(ctx, idemBatch("req-1", tc.ops...), res); !errors.Is(err, store.ErrIdempotencyMismatch) || replayed {
				t.Fatalf("reuse: replayed=%v err=%v, want ErrIdempotencyMismatch", replayed, err)
			}
			// Nothing consumed by the refused reuse, and the first batch still replays.
			if r := apply(t, s, op("k", p, 0), op("g", p, 0), op("other", p, 0)); r[0].Remaining != 7 || r[1].Remaining != 9 || r[2].Remaining != 10 {
				t.Errorf("after the refused reuse: remaining %d %d %d, want 7 9 10", r[0].Remaining, r[1].Remaining, r[2].Remaining)
			}
			res = make([]algorithm.Result, len(first))
			if replayed, err := s.Apply(ctx, idemBatch("req-1", first...), res); err != nil || !replayed || res[0].Remaining != 7 {
				t.Errorf("retry of the first batch: replayed=%v err=%v remaining %d", replayed, err, res[0].Remaining)
			}
		})
	}
}

// TestDenialsAreNotRemembered: a denied batch leaves no record, so its retry after Retry-After
// is decided afresh, and denials with distinct keys cost no memory.
func TestDenialsAreNotRemembered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := newStore(c)
	defer s.Close()
	p := params(t, algorithm.FixedWindow, 1, time.Second)
	apply(t, s, op("k", p, 1))
	res := make([]algorithm.Result, 1)
	for i := range 30_000 {
		if _, err := s.Apply(ctx, idemBatch(fmt.Sprint("denied-", i), op("k", p, 1)), res); err != nil || res[0].Allowed {
			t.Fatalf("request %d: err %v allowed %v", i, err, res[0].Allowed)
		}
	}
	if n := s.idemRecords(); n != 0 {
		t.Fatalf("30,000 denied requests left %d idempotency records, want 0", n)
	}
	c.Add(time.Duration(res[0].RetryAfter) * time.Microsecond)
	if replayed, err := s.Apply(ctx, idemBatch("denied-7", op("k", p, 1)), res); err != nil || replayed || !res[0].Allowed {
		t.Fatalf("retry after Retry-After: replayed=%v err=%v allowed=%v, want a new decision, allowed", replayed, err, res[0].Allowed)
	}
	if n := s.idemRecords(); n != 1 {
		t.Fatalf("after one allowed request: %d records, want 1", n)
	}
}

// TestSnapshotKeepsFingerprints: a record read back from a snapshot is still bound to its
// batch; a record of the earlier format, with no fingerprint, is read and dropped.
func TestSnapshotKeepsFingerprints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	path := filepath.Join(t.TempDir(), "state.snap")
	s := newStore(c, WithSnapshot(path, 0))
	p := params(t, algorithm.FixedWindow, 10, time.Hour)
	first := idemBatch("req-1", op("k", p, 2))
	res := make([]algorithm.Result, 1)
	s.Apply(ctx, first, res)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(c, WithSnapshot(path, 0))
	defer s2.Close()
	if replayed, err := s2.Apply(ctx, first, res); err != nil || !replayed || res[0].Remaining != 8 {
		t.Errorf("retry after restart: replayed=%v err=%v remaining %d", replayed, err, res[0].Remaining)
	}
	if _, err := s2.Apply(ctx, idemBatch("req-1", op("k", p, 5)), res); !errors.Is(err, store.ErrIdempotencyMismatch) {
		t.Errorf("reuse after restart: err %v, want ErrIdempotencyMismatch", err)
	}

	// An earlier version's record: kind 'i', key, expiry, results, no fingerprint.
	old := []byte{recIdemUnbound}
	old = binary.AppendUvarint(old, 5)
	old = append(old, "req-2"...)
	old = binary.AppendVarint(old, t0+time.Hour.Microseconds())
	old = binary.AppendUvarint(old, 1)
	old = append(old, 1, 0)
	for range 4 {
		old = binary.AppendVarint(old, 0)
	}
	snap := append([]byte(snapshotMagic), frame(nil, old)...)
	snap = append(snap, frame(nil, binary.AppendUvarint([]byte{recEnd}, 1))...)
	s3 := newStore(c)
	defer s3.Close()
	if n, err := s3.ReadSnapshot(bytes.NewReader(snap)); n != 1 || err != nil {
		t.Fatalf("earlier snapshot: read %d records, %v", n, err)
	}
	if n := s3.idemRecords(); n != 0 {
		t.Errorf("earlier snapshot: %d idempotency records kept, want 0 (unbound)", n)
	}
}

// TestSnapshotKeepsSlots: a concurrency key's leases in flight survive a restart, each
// returning at its own expiry afterwards.
func TestSnapshotKeepsSlots(t *testing.T) {
	t.Parallel()
	c := newClock()
	path := filepath.Join(t.TempDir(), "state.snap")
	s := newStore(c, WithSnapshot(path, 0))
	p, err := algorithm.NewParams(algorithm.Concurrency, 3, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, ttl := range []int64{1_000_000, 5_000_000} {
		o := op("jobs", &p, 1)
		o.Slot, o.SlotTTL = []byte{'a' + byte(i)}, ttl
		if r := apply(t, s, o)[0]; !r.Allowed {
			t.Fatalf("slot %d: %+v", i, r)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(c, WithSnapshot(path, 0))
	defer s2.Close()
	if r := apply(t, s2, op("jobs", &p, 0))[0]; r.Remaining != 1 {
		t.Fatalf("after restart: %d slots free, want 1", r.Remaining)
	}
	c.Add(time.Second)
	if r := apply(t, s2, op("jobs", &p, 0))[0]; r.Remaining != 2 {
		t.Fatalf("at the first slot's expiry: %d free, want 2", r.Remaining)
	}
	b := []store.Op{op("jobs", &p, 0)}
	b[0].Slot = []byte{'b'}
	if err := s2.Adjust(context.Background(), b, []int64{0}); err != nil {
		t.Fatal(err)
	}
	if r := apply(t, s2, op("jobs", &p, 0))[0]; r.Remaining != 3 {
		t.Fatalf("the second slot freed after restart: %d free, want 3", r.Remaining)
	}
}
