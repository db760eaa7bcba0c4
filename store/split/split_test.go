package split

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

var ctx = context.Background()

// fixture is a split store over two stores of one backend (memory, or two real Redis
// servers) on one test clock.
type fixture struct {
	now         int64
	long, short keyStore
	s           *Store
}

// keyStore is a store that lists its keys: both backends are.
type keyStore interface {
	store.Store
	store.KeyDirectory
}

// backends are the stores the split is tested over: they must decide alike.
var backends = []string{"memory", "redis"}

func newFixture(t *testing.T, backend string) *fixture {
	t.Helper()
	f := &fixture{now: 1_800_000_000_000_000}
	clock := func() int64 { return f.now }
	switch backend {
	case "memory":
		f.long, f.short = memory.New(memory.WithClock(clock)), memory.New(memory.WithClock(clock))
	case "redis":
		open := func() keyStore {
			st, err := redis.New(ctx, "redis://"+redistest.Start(t).Addr, redis.WithTimeForTests(clock), redis.WithTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		f.long, f.short = open(), open()
	}
	f.s = New(f.long, f.short, 0)
	t.Cleanup(func() { f.s.Close() })
	return f
}

// held lists the bucket keys st holds, but for the look's op key, which the memory store
// keeps (empty) until it sweeps and Redis never writes.
func held(t *testing.T, st keyStore) []string {
	t.Helper()
	var out []string
	if err := st.Keys(ctx, []byte(key.Prefix), func(k []byte) {
		if !strings.HasPrefix(string(k), "sl:!split:") {
			out = append(out, string(k))
		}
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func params(t *testing.T, kind algorithm.Kind, n int64, period time.Duration) *algorithm.Params {
	t.Helper()
	p, err := algorithm.NewParams(kind, n, 0, period)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testSplit(t, backend)
		})
	}
}

func testSplit(t *testing.T, backend string) {
	perSecond := key.AppendTag(key.AppendHead(nil, "per-second", "1"), 'u', "alice")
	perMinute := key.AppendTag(key.AppendHead(nil, "per-minute", "1"), 'u', "alice")
	perHalfSecond := key.AppendHead(nil, "per-half-second", "1")
	counter := key.AppendTag(key.AppendHead(nil, "burst-counter", "1"), 'u', "alice")

	for _, tc := range []struct {
		name        string
		ops         func(t *testing.T) []store.Op
		wantLong    []string
		wantShort   []string
		allowedEach [][]bool // per request, per op
	}{
		{
			name: "only per-second limits: the per-second store alone",
			ops: func(t *testing.T) []store.Op {
				return []store.Op{
					{Key: perSecond, Params: params(t, algorithm.FixedWindow, 2, time.Second), Cost: 1},
					{Key: perHalfSecond, Params: params(t, algorithm.TokenBucket, 5, 500*time.Millisecond), Cost: 1},
				}
			},
			wantShort:   []string{string(perHalfSecond), string(perSecond)},
			allowedEach: [][]bool{{true, true}, {true, true}, {false, true}},
		},
		{
			name: "only longer limits: the main store alone",
			ops: func(t *testing.T) []store.Op {
				return []store.Op{{Key: perMinute, Params: params(t, algorithm.SlidingWindowCounter, 1, time.Minute), Cost: 1}}
			},
			wantLong:    []string{string(perMinute)},
			allowedEach: [][]bool{{true}, {false}},
		},
		{
			name: "per-second denies: the per-minute limit consumes nothing",
			ops: func(t *testing.T) []store.Op {
				return []store.Op{
					{Key: perMinute, Params: params(t, algorithm.FixedWindow, 10, time.Minute), Cost: 1},
					{Key: perSecond, Params: params(t, algorithm.FixedWindow, 1, time.Second), Cost: 1},
				}
			},
			wantLong:  []string{string(perMinute)},
			wantShort: []string{string(perSecond)},
			// The third request is denied by the per-second limit; the minute's count stays at 1.
			allowedEach: [][]bool{{true, true}, {true, false}, {true, false}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, backend)
			ops := tc.ops(t)
			res := make([]algorithm.Result, len(ops))
			for r, want := range tc.allowedEach {
				if _, err := f.s.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
					t.Fatal(err)
				}
				for i := range ops {
					if res[i].Allowed != want[i] {
						t.Fatalf("request %d, op %d (%s): allowed=%v, want %v", r, i, ops[i].Key, res[i].Allowed, want[i])
					}
				}
			}
			if got := held(t, f.long); !slices.Equal(got, tc.wantLong) {
				t.Errorf("main store holds %q, want %q", got, tc.wantLong)
			}
			if got := held(t, f.short); !slices.Equal(got, tc.wantShort) {
				t.Errorf("per-second store holds %q, want %q", got, tc.wantShort)
			}
		})
	}

	t.Run("a denied request consumes nothing; counters count it", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, backend)
		minute := params(t, algorithm.FixedWindow, 10, time.Minute)
		ops := []store.Op{
			{Key: perMinute, Params: minute, Cost: 1},
			{Key: counter, Params: params(t, algorithm.FixedWindow, 1000, 10*time.Second), Cost: 1, Counter: true},
			{Key: perSecond, Params: params(t, algorithm.FixedWindow, 1, time.Second), Cost: 1},
		}
		res := make([]algorithm.Result, len(ops))
		for range 3 {
			if _, err := f.s.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
				t.Fatal(err)
			}
		}
		// The last two were denied by the per-second limit. The minute's limit reports what it
		// has left, as one store reports an allowed sibling of a denial; and its count is the
		// first request's alone.
		if res[2].Allowed || !res[0].Allowed || res[0].Remaining != 9 {
			t.Fatalf("denied request's results %+v", res)
		}
		look := make([]algorithm.Result, 2)
		if _, err := f.long.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: perMinute, Params: minute}, {Key: counter, Params: ops[1].Params}}}, look); err != nil {
			t.Fatal(err)
		}
		if look[0].Remaining != 9 {
			t.Fatalf("the minute's limit has %d left, want 9: a denied request consumed", look[0].Remaining)
		}
		if look[1].Remaining != 1000-3 {
			t.Fatalf("the counter has %d left, want %d: it counts every request", look[1].Remaining, 1000-3)
		}
		if got := held(t, f.long); !slices.Equal(got, []string{string(counter), string(perMinute)}) {
			t.Fatalf("main store holds %q", got)
		}
		if backend == "redis" {
			n := 0
			if err := f.long.Keys(ctx, []byte("sl:!split:"), func([]byte) { n++ }); err != nil || n != 0 {
				t.Fatalf("Redis holds %d keys of the look's op (%v): a denied op must write nothing", n, err)
			}
		}
	})

	t.Run("the longer limit denies: the per-second part stays consumed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, backend)
		ops := []store.Op{
			{Key: perMinute, Params: params(t, algorithm.FixedWindow, 1, time.Minute), Cost: 1},
			{Key: perSecond, Params: params(t, algorithm.FixedWindow, 5, time.Second), Cost: 1},
		}
		res := make([]algorithm.Result, 2)
		for range 2 {
			if _, err := f.s.Apply(ctx, &store.Batch{Ops: ops}, res); err != nil {
				t.Fatal(err)
			}
		}
		if res[0].Allowed || !res[1].Allowed || res[1].Remaining != 3 {
			t.Fatalf("second request %+v: want the minute denying and the second's count at 2 (the documented cost of the split)", res)
		}
		f.now += time.Second.Microseconds()
		if _, err := f.s.Apply(ctx, &store.Batch{Ops: ops[1:]}, res[:1]); err != nil || res[0].Remaining != 4 {
			t.Fatalf("next second: %+v, %v; want the per-second count back to 1", res[0], err)
		}
	})

	t.Run("idempotent retry replays both parts", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, backend)
		ops := []store.Op{
			{Key: perMinute, Params: params(t, algorithm.FixedWindow, 5, time.Minute), Cost: 1},
			{Key: perSecond, Params: params(t, algorithm.FixedWindow, 5, time.Second), Cost: 1},
		}
		fp, _ := store.FingerprintOf(ops, nil)
		b := func() *store.Batch {
			return &store.Batch{Ops: ops, IdempotencyKey: []byte("retry-1"), IdempotencyTTL: time.Minute, IdempotencyFingerprint: fp}
		}
		res := make([]algorithm.Result, 2)
		if replayed, err := f.s.Apply(ctx, b(), res); err != nil || replayed {
			t.Fatalf("first: replayed=%v err=%v", replayed, err)
		}
		if replayed, err := f.s.Apply(ctx, b(), res); err != nil || !replayed || res[0].Remaining != 4 || res[1].Remaining != 4 {
			t.Fatalf("retry: replayed=%v err=%v %+v; want the first answer replayed", replayed, err, res)
		}
	})
}

// TestSplitAllocations: a request with limits in both stores allocates nothing in the split
// once its pool is warm (the memory stores' own allocations aside, measured apart).
func TestSplitAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	f := newFixture(t, "memory")
	ops := []store.Op{
		{Key: key.AppendHead(nil, "m", "1"), Params: params(t, algorithm.GCRA, 1e9, time.Minute), Cost: 1},
		{Key: key.AppendHead(nil, "s", "1"), Params: params(t, algorithm.GCRA, 1e9, time.Second), Cost: 1},
	}
	res := make([]algorithm.Result, 2)
	b := &store.Batch{Ops: ops}
	f.s.Apply(ctx, b, res)
	split := testing.AllocsPerRun(100, func() { f.s.Apply(ctx, b, res) })
	direct := testing.AllocsPerRun(100, func() {
		f.long.Apply(ctx, &store.Batch{Ops: ops[:1]}, res[:1])
		f.short.Apply(ctx, &store.Batch{Ops: ops[1:]}, res[1:])
	})
	if split > direct {
		t.Fatalf("split Apply: %.1f allocations, the two stores alone %.1f", split, direct)
	}
}

func BenchmarkSplit(b *testing.B) {
	long, short := memory.New(), memory.New()
	s := New(long, short, 0)
	defer s.Close()
	p1, _ := algorithm.NewParams(algorithm.GCRA, 1e9, 0, time.Minute)
	p2, _ := algorithm.NewParams(algorithm.GCRA, 1e9, 0, time.Second)
	ops := []store.Op{{Key: key.AppendHead(nil, "m", "1"), Params: &p1, Cost: 1}, {Key: key.AppendHead(nil, "s", "1"), Params: &p2, Cost: 1}}
	res := make([]algorithm.Result, 2)
	b.ReportAllocs()
	for b.Loop() {
		s.Apply(ctx, &store.Batch{Ops: ops}, res)
	}
}
