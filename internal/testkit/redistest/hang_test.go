package redistest

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestPauseFor: the times returned bracket the pause, and the server answers after it
// (what a paused server does is TestPause's).
func TestPauseFor(t *testing.T) {
	t.Parallel()
	s := Start(t)
	paused, resumed := s.PauseFor(t, 300*time.Millisecond)
	if d := resumed.Sub(paused); d < 300*time.Millisecond {
		t.Errorf("paused %v, want at least 300ms", d)
	}
	if got := must(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING after the pause = %q", got)
	}
}

// TestStartLoad: every caller makes its call once and calls it until Stop, and none calls
// after Stop returns, which may be called again.
func TestStartLoad(t *testing.T) {
	t.Parallel()
	var made, calls atomic.Int64
	load := StartLoad(t, 4, time.Millisecond, func(int) func() {
		made.Add(1)
		return func() { calls.Add(1) }
	})
	for calls.Load() < 40 {
		time.Sleep(time.Millisecond)
	}
	load.Stop()
	n := calls.Load()
	time.Sleep(20 * time.Millisecond)
	load.Stop()
	if got := calls.Load(); got != n {
		t.Errorf("%d calls after Stop", got-n)
	}
	if got := made.Load(); got != 4 {
		t.Errorf("newCall called %d times, want 4", got)
	}
}
