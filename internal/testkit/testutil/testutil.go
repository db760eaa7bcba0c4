// Package testutil builds what Sluice's tests share: a settable clock (time is the only thing
// tests fake) and a real Limiter over the memory store from a YAML policy.
package testutil

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// Start is where test clocks begin: a whole second, so windows start on it.
var Start = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// Clock is a clock tests move by hand.
type Clock struct{ us atomic.Int64 }

// NewClock returns a Clock at Start.
func NewClock() *Clock {
	c := &Clock{}
	c.us.Store(Start.UnixMicro())
	return c
}

// Micros is the store's clock: µs since the Unix epoch.
func (c *Clock) Micros() int64 { return c.us.Load() }

// Now is the wall clock overrides expire by.
func (c *Clock) Now() time.Time { return time.UnixMicro(c.us.Load()).UTC() }

// Add moves the clock.
func (c *Clock) Add(d time.Duration) { c.us.Add(d.Microseconds()) }

// Snapshot compiles a native YAML policy or fails the test.
func Snapshot(t testing.TB, yml string) *policy.Snapshot {
	t.Helper()
	snap, err := policy.LoadFiles(map[string][]byte{"test.yaml": []byte(yml)})
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return snap
}

// Limiter returns a Limiter with policy yml (native or Envoy format) over a memory store on
// clock c, closed when the test ends.
func Limiter(t testing.TB, yml string, c *Clock) *sluice.Limiter {
	t.Helper()
	st := memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0))
	l, err := sluice.New(st, Snapshot(t, yml), sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
