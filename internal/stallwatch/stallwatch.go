// Package stallwatch measures when a test process did not run at all (a loaded machine that
// deschedules it, a stop-the-world pause), so that a latency bound in a test can discount what
// no code under test could have avoided.
package stallwatch

import (
	"sync"
	"testing"
	"time"
)

// late is how far past its time a wake-up must come to count as a stall: scheduling noise
// below it is left to the bound's own margin.
const late = 20 * time.Millisecond

// Watch records stalls of the process until the test ends: a goroutine asks to wake every
// millisecond and notes each wake-up that came more than 20 ms late.
type Watch struct {
	mu   sync.Mutex
	gaps [][2]time.Time // [asleep since, woke at]
}

// Start starts a Watch that stops when t ends.
func Start(t testing.TB) *Watch {
	w := &Watch{}
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			var now time.Time
			select {
			case <-stop:
				return
			case now = <-tick.C:
			}
			now = time.Now() // the tick's time is when it was due, not when this ran
			if now.Sub(last) > time.Millisecond+late {
				w.mu.Lock()
				w.gaps = append(w.gaps, [2]time.Time{last, now})
				w.mu.Unlock()
			}
			last = now
		}
	}()
	return w
}

// During returns how long the process stalled between start and end: a call that took that
// much longer than it should was not late by its own doing.
func (w *Watch) During(start, end time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, g := range w.gaps {
		from, to := g[0], g[1]
		if from.Before(start) {
			from = start
		}
		if to.After(end) {
			to = end
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return d
}
