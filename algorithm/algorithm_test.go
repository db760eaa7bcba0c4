package algorithm

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// base is a whole second far from the epoch, so windows start on it.
const base = int64(1_800_000_000_000_000)

const (
	ms = int64(1000)
	s1 = int64(1_000_000)
)

type step struct {
	at        int64 // µs after base
	cost      int64
	allowed   bool
	remaining int64
	retry     int64 // µs
	reset     int64 // µs
	delay     int64 // µs, leaky_bucket only
	reason    Reason
}

func mustParams(t testing.TB, k Kind, n, b int64, period time.Duration) Params {
	t.Helper()
	p, err := NewParams(k, n, b, period)
	if err != nil {
		t.Fatalf("NewParams(%s, %d, %d, %s): %v", k, n, b, period, err)
	}
	return p
}

func run(t *testing.T, p Params, s *State, steps []step) {
	t.Helper()
	for i, st := range steps {
		now := base + st.at
		r := Decide(&p, s, now, st.cost)
		if r.Allowed && st.cost > 0 {
			Commit(&p, s, now, st.cost)
		}
		if r.Allowed != st.allowed || r.Remaining != st.remaining || r.RetryAfter != st.retry ||
			r.ResetAfter != st.reset || r.Delay != st.delay || r.Reason != st.reason {
			t.Errorf("step %d (at %dµs, cost %d): got allowed=%v remaining=%d retry=%d reset=%d delay=%d reason=%d; want allowed=%v remaining=%d retry=%d reset=%d delay=%d reason=%d",
				i, st.at, st.cost, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, r.Delay, r.Reason,
				st.allowed, st.remaining, st.retry, st.reset, st.delay, st.reason)
		}
	}
}

// bucketSteps are the token bucket formulas (docs/architecture.md, Buckets) worked by hand for 10 per second, burst 10:
// one token every 100 ms.
var bucketSteps = []step{
	{at: 0, cost: 0, allowed: true, remaining: 10},
	{at: 0, cost: 1, allowed: true, remaining: 9, reset: 100 * ms},
	{at: 0, cost: 9, allowed: true, remaining: 0, reset: s1},
	{at: 0, cost: 1, remaining: 0, retry: 100 * ms, reset: s1},
	{at: 50 * ms, cost: 1, remaining: 0, retry: 50 * ms, reset: 950 * ms},
	{at: 50 * ms, cost: 0, allowed: true, remaining: 0, reset: 950 * ms},
	{at: 100 * ms, cost: 1, allowed: true, remaining: 0, reset: s1},
	{at: 350 * ms, cost: 3, remaining: 2, retry: 50 * ms, reset: 750 * ms},
	{at: 400 * ms, cost: 3, allowed: true, remaining: 0, reset: s1},
	{at: 400 * ms, cost: 11, remaining: 0, reset: s1, reason: ReasonCostExceedsCapacity},
	{at: 10 * s1, cost: 0, allowed: true, remaining: 10},
	{at: 10 * s1, cost: 10, allowed: true, remaining: 0, reset: s1},
}

func TestBucketAlgorithms(t *testing.T) {
	t.Parallel()
	// Leaky bucket queues: each allowed request waits behind the level it found.
	leaky := append([]step(nil), bucketSteps...)
	leaky[2].delay = 100 * ms // one request queued before it
	leaky[6].delay = 900 * ms // nine still queued at 100 ms
	leaky[8].delay = 700 * ms // seven still queued at 400 ms
	for _, k := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			steps := bucketSteps
			if k == LeakyBucket {
				steps = leaky
			}
			var s State
			run(t, mustParams(t, k, 10, 10, time.Second), &s, steps)
		})
	}
}

func TestBurstAboveRate(t *testing.T) {
	t.Parallel()
	// 1 per second with a burst of 5: five at once, then one a second; refill caps at the burst.
	for _, k := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			var s State
			steps := []step{
				{at: 0, cost: 5, allowed: true, remaining: 0, reset: 5 * s1},
				{at: 0, cost: 1, remaining: 0, retry: s1, reset: 5 * s1},
				{at: s1, cost: 1, allowed: true, remaining: 0, reset: 5 * s1},
				{at: 100 * s1, cost: 0, allowed: true, remaining: 5},
				{at: 100 * s1, cost: 6, remaining: 5, reason: ReasonCostExceedsCapacity},
			}
			if k == LeakyBucket {
				steps[2].delay = 4 * s1
			}
			run(t, mustParams(t, k, 1, 5, time.Second), &s, steps)
		})
	}
}

func TestFixedWindow(t *testing.T) {
	t.Parallel()
	var s State
	run(t, mustParams(t, FixedWindow, 3, 0, time.Second), &s, []step{
		{at: 0, cost: 0, allowed: true, remaining: 3, reset: s1},
		{at: 0, cost: 1, allowed: true, remaining: 2, reset: s1},
		{at: 10 * ms, cost: 2, allowed: true, remaining: 0, reset: 990 * ms},
		{at: 20 * ms, cost: 1, remaining: 0, retry: 980 * ms, reset: 980 * ms},
		{at: s1 - 1, cost: 1, remaining: 0, retry: 1, reset: 1},
		{at: s1, cost: 1, allowed: true, remaining: 2, reset: s1},
		{at: s1, cost: 4, remaining: 2, reset: s1, reason: ReasonCostExceedsCapacity},
		{at: 5 * s1, cost: 3, allowed: true, remaining: 0, reset: s1},
	})
}

func TestSlidingWindowCounter(t *testing.T) {
	t.Parallel()
	// A limit of 10 keeps buckets of one unit each: the counter is then an exact log.
	var s State
	run(t, mustParams(t, SlidingWindowCounter, 10, 0, time.Second), &s, []step{
		{at: 0, cost: 10, allowed: true, remaining: 0, reset: s1},
		// The window is (now-1s, now]: the ten at 0 leave at exactly 1 s.
		{at: 0, cost: 1, remaining: 0, retry: s1, reset: s1},
		{at: s1, cost: 1, allowed: true, remaining: 9, reset: s1},
		{at: 1500 * ms, cost: 9, allowed: true, remaining: 0, reset: s1},
		{at: 1600 * ms, cost: 1, remaining: 0, retry: 400 * ms, reset: 900 * ms},
		// The unit of 1 s has left; the 9 of 1.5 s must leave for a cost of 2.
		{at: 2 * s1, cost: 2, remaining: 1, retry: 500 * ms, reset: 500 * ms},
		{at: 2 * s1, cost: 11, remaining: 1, reset: 500 * ms, reason: ReasonCostExceedsCapacity},
		{at: 9 * s1, cost: 0, allowed: true, remaining: 10},
	})
	// A limit of 100 keeps buckets of 5: the oldest, cut by the window's start, is estimated.
	var b State
	run(t, mustParams(t, SlidingWindowCounter, 100, 0, time.Second), &b, []step{
		{at: 0, cost: 1, allowed: true, remaining: 99, reset: s1},
		{at: 100 * ms, cost: 1, allowed: true, remaining: 98, reset: s1},
		{at: 200 * ms, cost: 1, allowed: true, remaining: 97, reset: s1},
		{at: 300 * ms, cost: 1, allowed: true, remaining: 96, reset: s1},
		{at: 400 * ms, cost: 1, allowed: true, remaining: 95, reset: s1},
		// The bucket [0, 400ms] holds 5: the 95 open another.
		{at: 500 * ms, cost: 95, allowed: true, remaining: 0, reset: s1},
		// From 200 ms on, half the first bucket's span is left: ⌈2.5⌉ = 3 counted (2 are).
		{at: 1200 * ms, cost: 0, allowed: true, remaining: 2, reset: 300 * ms},
		// 3 fit once the first bucket's share is 2: a window from 240 ms, at 1.24 s.
		{at: 1200 * ms, cost: 3, remaining: 2, retry: 40 * ms, reset: 300 * ms},
		{at: 1240 * ms, cost: 3, allowed: true, remaining: 0, reset: s1},
	})
	if n := len(b.Log.Buckets); n != 3 {
		t.Errorf("%d buckets, want 3: %+v", n, b.Log.Buckets)
	}
}

func TestSlidingWindowLog(t *testing.T) {
	t.Parallel()
	var s State
	run(t, mustParams(t, SlidingWindowLog, 3, 0, time.Second), &s, []step{
		{at: 0, cost: 1, allowed: true, remaining: 2, reset: s1},
		{at: 100 * ms, cost: 1, allowed: true, remaining: 1, reset: s1},
		{at: 200 * ms, cost: 1, allowed: true, remaining: 0, reset: s1},
		{at: 300 * ms, cost: 1, remaining: 0, retry: 700 * ms, reset: 900 * ms},
		// Two must leave for a cost of 2: the second leaves at 1.1 s.
		{at: 300 * ms, cost: 2, remaining: 0, retry: 800 * ms, reset: 900 * ms},
		{at: 300 * ms, cost: 4, remaining: 0, reset: 900 * ms, reason: ReasonCostExceedsCapacity},
		// The window is (now-1s, now]: the entry at 0 leaves at exactly 1 s.
		{at: s1 - 1, cost: 1, remaining: 0, retry: 1, reset: 200*ms + s1 - (s1 - 1)},
		{at: s1, cost: 1, allowed: true, remaining: 0, reset: s1},
		{at: 5 * s1, cost: 0, allowed: true, remaining: 3},
	})
	if n := len(s.Log.Entries); n != 0 {
		t.Errorf("log keeps %d entries after the window passed, want 0", n)
	}
}

// TestChangedLimits checks that state written under one limit is read sensibly under another:
// an override or a policy edit must neither refill a spent bucket nor lose the count.
func TestChangedLimits(t *testing.T) {
	t.Parallel()
	type change struct {
		name      string
		kind      Kind
		before    [2]int64 // limit, burst
		after     [2]int64
		spend     int64
		remaining int64 // right after the change, at the same instant
	}
	cases := []change{
		{"token bucket raised", TokenBucket, [2]int64{10, 10}, [2]int64{20, 20}, 10, 0},
		{"token bucket lowered below what is left", TokenBucket, [2]int64{100, 100}, [2]int64{10, 10}, 5, 10},
		{"gcra raised keeps its debt in time", GCRA, [2]int64{10, 10}, [2]int64{20, 20}, 10, 0},
		{"leaky bucket lowered", LeakyBucket, [2]int64{100, 100}, [2]int64{10, 10}, 95, 0},
		{"fixed window lowered below the count", FixedWindow, [2]int64{10, 0}, [2]int64{3, 0}, 5, 0},
		{"sliding counter raised", SlidingWindowCounter, [2]int64{10, 0}, [2]int64{20, 0}, 10, 10},
		{"sliding log lowered", SlidingWindowLog, [2]int64{10, 0}, [2]int64{4, 0}, 3, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var s State
			p1 := mustParams(t, c.kind, c.before[0], c.before[1], time.Second)
			if r := Decide(&p1, &s, base, c.spend); !r.Allowed {
				t.Fatalf("spend %d under the old limit denied", c.spend)
			}
			Commit(&p1, &s, base, c.spend)
			p2 := mustParams(t, c.kind, c.after[0], c.after[1], time.Second)
			r := Decide(&p2, &s, base, 0)
			if r.Remaining != c.remaining {
				t.Errorf("remaining after the change = %d, want %d", r.Remaining, c.remaining)
			}
			// And the new rate takes over from there: never more than the new capacity.
			r = Decide(&p2, &s, base+100*s1, 0)
			if r.Remaining != p2.Capacity() {
				t.Errorf("remaining long after = %d, want the new capacity %d", r.Remaining, p2.Capacity())
			}
		})
	}
}

func TestNewParams(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		kind    Kind
		n, b    int64
		period  time.Duration
		wantErr bool
		tick    int64
	}{
		{"per second", TokenBucket, 10, 0, time.Second, false, 1},
		{"a thousand per day counts in µs", SlidingWindowCounter, 1_000, 0, 24 * time.Hour, false, 1},
		{"ten million per day needs a coarser tick", SlidingWindowCounter, 10_000_000, 0, 24 * time.Hour, false, 10_000},
		{"prime limit per day", GCRA, 999_983, 0, 24 * time.Hour, false, 100},
		{"zero limit", FixedWindow, 0, 0, time.Second, false, 1},
		{"negative limit", FixedWindow, -1, 0, time.Second, true, 0},
		{"period too short", TokenBucket, 1, 0, time.Microsecond, true, 0},
		{"period not whole µs", TokenBucket, 1, 0, time.Millisecond + time.Nanosecond, true, 0},
		{"unknown kind", Kind(99), 1, 0, time.Second, true, 0},
		{"limit too large", TokenBucket, MaxLimit + 1, 0, time.Second, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewParams(c.kind, c.n, c.b, c.period)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if err == nil && p.tick != c.tick {
				t.Errorf("tick = %d µs, want %d", p.tick, c.tick)
			}
		})
	}
}

func TestParseKind(t *testing.T) {
	t.Parallel()
	for _, k := range Kinds {
		got, err := ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	if _, err := ParseKind("token-bucket"); err == nil {
		t.Error("ParseKind accepted a misspelled name")
	}
}

func TestUndoRestoresLog(t *testing.T) {
	t.Parallel()
	p := mustParams(t, SlidingWindowLog, 10, 0, time.Second)
	var s State
	Decide(&p, &s, base, 1)
	Commit(&p, &s, base, 1)
	for _, cost := range []int64{2, 3} { // merge into the same µs, then append
		at := base
		if cost == 3 {
			at = base + 1
		}
		Decide(&p, &s, at, cost)
		var u Undo
		u.Save(&s)
		Commit(&p, &s, at, cost)
		u.Restore(&s)
		if r := Decide(&p, &s, at, 0); r.Remaining != 9 || len(s.Log.Entries) != 1 || s.Log.Entries[0].Cost != 1 {
			t.Fatalf("after undo of cost %d: remaining %d, entries %v", cost, r.Remaining, s.Log.Entries)
		}
	}
}

// TestLookIsAlwaysAllowed: a cost-0 look over a limit lowered below what was used is allowed,
// in every algorithm (the token bucket keeps its one token left; the others are spent).
func TestLookIsAlwaysAllowed(t *testing.T) {
	t.Parallel()
	for _, k := range Kinds {
		var s State
		high := mustParams(t, k, 10, 10, time.Second)
		Decide(&high, &s, base, 9)
		Commit(&high, &s, base, 9)
		low := mustParams(t, k, 2, 2, time.Second)
		if r := Decide(&low, &s, base, 0); !r.Allowed || r.Remaining > 1 {
			t.Errorf("%s: look over a lowered limit: %+v", k, r)
		}
	}
}

// TestUndoRestoresCounterBuckets runs batches on one sliding_window_counter key the way the
// memory store does: each op saves an Undo and commits, a denied batch restores them, last
// first, and the batch's end unpins. Buckets move between arrays as pruning uses them up
// (bucketArrays): a restored key must hold its buckets from before the batch, and a kept one
// the buckets of a deep copy that took the same commits alone.
func TestUndoRestoresCounterBuckets(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(28, 2))
	for trial := range 50 {
		p := mustParams(t, SlidingWindowCounter, 1+rng.Int64N(120), 0, time.Second)
		short := mustParams(t, SlidingWindowCounter, p.Limit, 0, 300*time.Millisecond)
		var s State
		now := base
		for batch := range 400 {
			now += rng.Int64N(30_000)
			before, ref := clone(s), clone(s)
			undos := make([]Undo, 0, 3)
			for range 1 + rng.IntN(3) {
				q := &p
				if rng.IntN(4) == 0 {
					q = &short // another period on the same key prunes further
				}
				cost := 1 + rng.Int64N(3)
				if !Decide(q, &s, now, cost).Allowed {
					break
				}
				undos = append(undos, Undo{})
				undos[len(undos)-1].Save(&s)
				Commit(q, &s, now, cost)
				Decide(q, &ref, now, cost)
				Commit(q, &ref, now, cost)
			}
			want := ref
			if rng.IntN(2) == 0 {
				for i := len(undos) - 1; i >= 0; i-- {
					undos[i].Restore(&s)
				}
				want = before
			}
			if s.Log != nil {
				s.Log.Unpin()
			}
			// T, V and W may have rolled in a restored batch's first Decide, before its
			// Save: the store drops an undone working copy's; the buckets are what is shared.
			if got, want := bucketsOf(s), bucketsOf(want); !slices.Equal(got, want) {
				t.Fatalf("trial %d batch %d: buckets %+v, want %+v", trial, batch, got, want)
			}
		}
	}
}

func bucketsOf(s State) []Bucket {
	if s.Log == nil {
		return nil
	}
	return s.Log.Buckets
}
