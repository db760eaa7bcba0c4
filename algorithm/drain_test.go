package algorithm

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// drain is what a store does for a limit that drains on deny: Take, and on a denial waiting
// could end, Drain and the decision again on the drained state.
func drain(p *Params, s *State, now, cost int64) Result {
	var r Result
	Take(p, s, now, cost, &r)
	if !r.Allowed && r.Reason == ReasonNone && p.Drains() {
		Drain(p, s, now)
		DecideInto(p, s, now, cost, &r)
	}
	return r
}

// TestDrainBucketEncodingsAgree extends TestBucketEncodingsAgree to draining buckets: the
// three encodings drain to the same empty bucket, so they still decide alike.
func TestDrainBucketEncodingsAgree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	drained := 0
	for trial := range 300 {
		tb, err := randomParams(t, rng, TokenBucket).WithDrain()
		if err != nil {
			t.Fatal(err)
		}
		gc, lb := tb, tb
		gc.Kind, lb.Kind = GCRA, LeakyBucket
		var sTB, sGC, sLB State
		for i, r := range traffic(rng, tb, 200) {
			a, b, c := drain(&tb, &sTB, r.at, r.cost), drain(&gc, &sGC, r.at, r.cost), drain(&lb, &sLB, r.at, r.cost)
			c.Delay = 0
			if a != b || a != c {
				t.Fatalf("trial %d (%d per %dµs, burst %d) request %d %+v:\n token_bucket %+v\n gcra         %+v\n leaky_bucket %+v",
					trial, tb.Limit, tb.Period, tb.Burst, i, r, a, b, c)
			}
			if !a.Allowed && a.Reason == ReasonNone {
				drained++
				if a.Remaining != 0 || a.ResetAfter < a.RetryAfter {
					t.Fatalf("trial %d request %d: drained bucket reports %+v", trial, i, a)
				}
			}
		}
	}
	if drained < 1000 {
		t.Fatalf("only %d drains", drained)
	}
}

// TestDrainEmptiesWhatIsLeft: a request the limit denies takes what was left, so the next
// request waits as long as a full limit's worth would.
func TestDrainEmptiesWhatIsLeft(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind            Kind
		spend           int64 // allowed first
		over            int64 // then denied, draining
		retry           int64 // µs until a request of 1 is allowed after the drain
		retryUndrained  int64 // the same without drain
		remainingBefore int64
	}{
		// 10 per second: 7 spent, 3 left; a request of 5 drains the 3.
		{TokenBucket, 7, 5, 100_000, 0, 3},
		{GCRA, 7, 5, 100_000, 0, 3},
		{LeakyBucket, 7, 5, 100_000, 0, 3},
		// A window of 10 per second at its start: the rest of the window.
		{FixedWindow, 7, 5, 1_000_000, 0, 3},
		{SlidingWindowLog, 7, 5, 1_000_000, 0, 3},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			t.Parallel()
			plain := mustParams(t, tc.kind, 10, 0, time.Second)
			p, err := plain.WithDrain()
			if err != nil {
				t.Fatal(err)
			}
			now := base
			for _, params := range []*Params{&plain, &p} {
				var s State
				if r := drain(params, &s, now, tc.spend); !r.Allowed || r.Remaining != tc.remainingBefore {
					t.Fatalf("spend: %+v", r)
				}
				r := drain(params, &s, now, tc.over)
				if r.Allowed {
					t.Fatalf("over: %+v", r)
				}
				want, wantRemaining := tc.retry, int64(0)
				if !params.Drains() {
					want, wantRemaining = tc.retryUndrained, tc.remainingBefore
				}
				if r.Remaining != wantRemaining {
					t.Errorf("drain %v: remaining %d after the denial, want %d", params.Drains(), r.Remaining, wantRemaining)
				}
				if got := Decide(params, &s, now, 1); got.RetryAfter != want {
					t.Errorf("drain %v: a request of 1 waits %dµs, want %d (%+v)", params.Drains(), got.RetryAfter, want, got)
				}
			}
		})
	}
}

func TestDrainRefusedForSlidingWindowCounter(t *testing.T) {
	t.Parallel()
	p := mustParams(t, SlidingWindowCounter, 10, 0, time.Second)
	if _, err := p.WithDrain(); !errors.Is(err, ErrParams) {
		t.Fatalf("sliding_window_counter took drain: %v", err)
	}
}
