package region

import (
	"context"
	"errors"
	"math"
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

// TestReceiveAndDecideNameTheField: what a peer sends is checked whole by the decorator itself,
// whatever the transport: a bad field is a *FieldError naming it and nothing is merged or
// consumed; a good Sync is merged.
func TestReceiveAndDecideNameTheField(t *testing.T) {
	t.Parallel()
	snap, err := policy.LoadFiles(map[string][]byte{"p.yaml": []byte("rules:\n  - {name: quota, key: [user], algorithm: fixed_window, limit: 100, period: 1000h, regions: global}\n  - {name: home, key: [], algorithm: fixed_window, limit: 100, period: 1000h, regions: \"home:a\"}\n")})
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.WithSweepInterval(0))
	r, err := New(Config{Name: "a", Peers: map[string]string{"b": "127.0.0.1:1"}}, mem, mem, func() *policy.Snapshot { return snap })
	if err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(r, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	lims := snap.Resolve(&sluice.Request{User: "ann"}, time.Time{}, new(policy.Scratch))
	ann, annParams := lims[0].Key, lims[0].Params
	home := snap.Rule("home").Head()
	good := WindowCount{Key: ann, WindowStartUs: 1, Count: 5}
	for _, c := range []struct {
		name  string
		msg   SyncMessage
		field string
	}{
		{"unknown region", SyncMessage{Region: "z", Counts: []WindowCount{good}}, "region"},
		{"empty key", SyncMessage{Region: "b", Counts: []WindowCount{good, {Count: 1}}}, "counts[1].key"},
		{"long key", SyncMessage{Region: "b", Counts: []WindowCount{{Key: make([]byte, maxKeyLen+1)}}}, "counts[0].key"},
		{"negative count", SyncMessage{Region: "b", Counts: []WindowCount{good, {Key: ann, Count: -1}}}, "counts[1].count"},
		{"negative window", SyncMessage{Region: "b", Counts: []WindowCount{{Key: ann, WindowStartUs: -5}}}, "counts[0].window_start_us"},
		{"negative rate", SyncMessage{Region: "b", Counts: []WindowCount{{Key: ann, Rate: -3}}}, "counts[0].rate"},
		{"NaN rate", SyncMessage{Region: "b", Counts: []WindowCount{{Key: ann, Rate: math.NaN()}}}, "counts[0].rate"},
	} {
		var fe *FieldError
		if err := r.Receive(&c.msg); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Receive %s: %v, want a FieldError naming %s", c.name, err, c.field)
		}
	}
	if n := r.Stats().RemoteKeys; n != 0 {
		t.Fatalf("refused syncs left %d keys", n)
	}
	op := func(o DecideOp) []DecideOp { return []DecideOp{o} }
	for _, c := range []struct {
		name  string
		req   DecideRequest
		field string
	}{
		{"other region", DecideRequest{Region: "b", Ops: op(DecideOp{Key: home})}, "region"},
		{"no ops", DecideRequest{Region: "a"}, "ops"},
		{"not a home key", DecideRequest{Region: "a", Ops: op(DecideOp{Key: ann, Algorithm: "fixed_window", Limit: 1, PeriodUs: 1e6, Cost: 1})}, "ops[0].key"},
		{"bad algorithm", DecideRequest{Region: "a", Ops: op(DecideOp{Key: home, Algorithm: "nope", Limit: 1, PeriodUs: 1e6})}, "ops[0].algorithm"},
		{"bad period", DecideRequest{Region: "a", Ops: op(DecideOp{Key: home, Algorithm: "fixed_window", Limit: 1})}, "ops[0].period_us"},
		{"bad limit", DecideRequest{Region: "a", Ops: op(DecideOp{Key: home, Algorithm: "fixed_window", Limit: -1, PeriodUs: 1e6})}, "ops[0].limit"},
		{"negative cost", DecideRequest{Region: "a", Ops: op(DecideOp{Key: home, Algorithm: "fixed_window", Limit: 1, PeriodUs: 1e6, Cost: -1})}, "ops[0].cost"},
		{"idempotency key without ttl", DecideRequest{Region: "a", IdempotencyKey: []byte("k"), Ops: op(DecideOp{Key: home, Algorithm: "fixed_window", Limit: 1, PeriodUs: 1e6, Cost: 1})}, "idempotency_ttl_ms"},
	} {
		var fe *FieldError
		if _, err := r.Decide(context.Background(), &c.req); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Decide %s: %v, want a FieldError naming %s", c.name, err, c.field)
		}
	}
	var d sluice.Decision
	if err := lim.Quota(context.Background(), &sluice.Request{}, &d); err != nil || d.Results[0].Remaining != 100 {
		t.Fatalf("refused decides consumed: remaining %d, %v", d.Results[0].Remaining, err)
	}
	// A good Sync is merged: the other region's 5 are taken off ann's limit here.
	now := time.Now().UnixMicro()
	start := now - now%annParams.Period
	if err := r.Receive(&SyncMessage{Region: "b", Counts: []WindowCount{{Key: ann, WindowStartUs: start, Count: 5, Rate: 0}}}); err != nil {
		t.Fatal(err)
	}
	if got := r.Remote(ann, annParams); got != 5 {
		t.Fatalf("after a Sync of 5 from b, Remote = %d", got)
	}
	if p := r.Stats().Peers[0]; p.Name != "b" || !p.Up || p.LastReport.IsZero() {
		t.Fatalf("after a Sync from b its figures are %+v, want b up with a report", p)
	}
}
