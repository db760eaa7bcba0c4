package region

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

func check(t *testing.T, lim *sluice.Limiter, r *sluice.Request) *sluice.Decision {
	t.Helper()
	var d sluice.Decision
	if err := lim.Check(context.Background(), r, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// TestMergeIsGrowOnly: repeated and reordered reports change nothing; a newer window
// replaces the oldest slot.
func TestMergeIsGrowOnly(t *testing.T) {
	t.Parallel()
	var pc peerCount
	for _, o := range []windowCount{{100, 5}, {100, 3}, {100, 7}, {200, 1}, {100, 6}, {300, 2}, {400, 9}} {
		pc.observe(o.start, o.count)
	}
	for _, w := range []windowCount{{100, 0}, {200, 1}, {300, 2}, {400, 9}} {
		if got := pc.count(w.start); got != w.count {
			t.Errorf("count(%d) = %d, want %d", w.start, got, w.count)
		}
	}
}

// TestPruneKeepsAKeyTouchedDuringTheRead: a tracked key whose window is over and whose rate
// fell to 0 is pruned after a read, unless a check consumed it after that read began: its new
// count must be read by the next sync, not forgotten until a listing finds it.
func TestPruneKeepsAKeyTouchedDuringTheRead(t *testing.T) {
	t.Parallel()
	snap, err := policy.LoadFiles(map[string][]byte{"p.yaml": []byte("rules:\n  - {name: quota, key: [user], algorithm: fixed_window, limit: 100, period: 1s, regions: global}\n")})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := memory.New(memory.WithClock(func() int64 { return now.UnixMicro() }), memory.WithSweepInterval(0))
	r, err := New(Config{Name: "a", Peers: map[string]string{"b": "127.0.0.1:1"}, Now: clock}, mem, mem, func() *policy.Snapshot { return snap })
	if err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(r, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ctx := context.Background()
	check(t, lim, &sluice.Request{User: "ann"})
	k := string(snap.Resolve(&sluice.Request{User: "ann"}, time.Time{}, new(policy.Scratch))[0].Key)
	tracked := func() bool {
		r.local.mu.Lock()
		defer r.local.mu.Unlock()
		return r.local.keys[k] != nil
	}
	seq, err := r.read(ctx, r.nowMicros())
	if err != nil || !tracked() {
		t.Fatalf("the consumed key is not tracked after a read (%v)", err)
	}
	// Three windows later the key is idle: its rate decays to 0 and it may be pruned...
	now = now.Add(3 * time.Second)
	if seq, err = r.read(ctx, r.nowMicros()); err != nil {
		t.Fatal(err)
	}
	// ...unless a check consumes it after the read began and before the prune.
	check(t, lim, &sluice.Request{User: "ann"})
	r.prune(seq, r.nowMicros())
	if !tracked() {
		t.Fatal("a key consumed during the read was pruned: the next sync would not read it")
	}
	// The next read reads what the check consumed.
	now = now.Add(500 * time.Millisecond)
	if _, err = r.read(ctx, r.nowMicros()); err != nil {
		t.Fatal(err)
	}
	r.local.mu.Lock()
	st := r.local.keys[k].st
	r.local.mu.Unlock()
	if want := now.Truncate(time.Second).UnixMicro(); st.T != want || st.V != 1 {
		t.Fatalf("after the next read the key holds %+v, want the new window's count of 1", st)
	}
	// Idle from then on: a later read's prune drops it.
	now = now.Add(10 * time.Second)
	if seq, err = r.read(ctx, r.nowMicros()); err != nil {
		t.Fatal(err)
	}
	r.prune(seq, r.nowMicros())
	if tracked() {
		t.Fatal("an idle key stays tracked")
	}
}
