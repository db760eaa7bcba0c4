package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/stallwatch"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
)

// TestPausedServerHonoursDeadline pauses Redis with SIGSTOP under 20 concurrent callers, each
// call with a 10 ms deadline and no breaker in front: every Apply and Reset returns by its
// deadline (plus a margin generous enough for a loaded machine under -race; waiting on the
// server would take the whole pause), however many abandoned calls rueidis holds for the
// stopped server, and the store answers again after SIGCONT.
func TestPausedServerHonoursDeadline(t *testing.T) {
	t.Parallel()
	const (
		deadline = 10 * time.Millisecond
		// Far below the pause, which a call waiting on the server would take whole, and far
		// above what a goroutine waits for a CPU under -race beside other packages' tests
		// (250 ms has been exceeded there).
		margin   = time.Second
		pauseFor = 3 * time.Second
		callers  = 20
	)
	head := key.AppendTag(key.AppendHead(nil, "paused", "1"), 'u', "caller")
	tag := string(key.HashTag(head))
	for _, tc := range redistest.HangTargets() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			url, owner := tc.Start(t, tag)
			st, err := New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000, 0, time.Second)

			stalls := stallwatch.Start(t)
			var mu sync.Mutex
			var slowest time.Duration
			var lastOK time.Time
			record := func(start time.Time, err error) {
				// Time the whole process did not run is no call's doing.
				d := time.Since(start) - stalls.During(start, time.Now())
				mu.Lock()
				defer mu.Unlock()
				slowest = max(slowest, d)
				if err == nil {
					lastOK = time.Now()
				} else if !errors.Is(err, store.ErrUnavailable) {
					t.Errorf("err %v, want store.ErrUnavailable", err)
				}
			}
			load := redistest.StartLoad(t, callers, time.Millisecond, func(i int) func() {
				// The batch and results are reused, as the limiter does: an abandoned call
				// that touched them afterwards would be a data race (-race).
				k := append(append([]byte(nil), head...), ':', byte('a'+i))
				b := &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}
				res := make([]algorithm.Result, 1)
				return func() {
					call, cancel := context.WithTimeout(ctx, deadline)
					defer cancel()
					start := time.Now()
					var err error
					if i%10 == 0 {
						err = st.Reset(call, [][]byte{k})
					} else {
						_, err = st.Apply(call, b, res)
					}
					record(start, err)
				}
			})

			time.Sleep(200 * time.Millisecond)
			_, resumed := owner.PauseFor(t, pauseFor)
			deadlineBack := resumed.Add(3 * time.Second)
			for {
				mu.Lock()
				ok := lastOK.After(resumed)
				mu.Unlock()
				if ok || time.Now().After(deadlineBack) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			load.Stop()

			t.Logf("slowest call %v (process stalls discounted)", slowest)
			if slowest > deadline+margin {
				t.Errorf("slowest call %v, deadline %v", slowest, deadline)
			}
			if !lastOK.After(resumed) {
				t.Errorf("no call succeeded within 3 s of SIGCONT")
			}
		})
	}
}
