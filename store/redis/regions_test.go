package redis

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

type regionStore interface {
	store.Store
	store.KeyDirectory
	store.StateReader
}

// checkRegionReads checks store.KeyDirectory and store.StateReader on st: the keys under a
// rule's head and no other, and each key's window and count, as Apply left them.
func checkRegionReads(t *testing.T, st regionStore, c *clock) {
	t.Helper()
	ctx := context.Background()
	fixed, _ := algorithm.NewParams(algorithm.FixedWindow, 100, 0, time.Minute)
	sliding, _ := algorithm.NewParams(algorithm.SlidingWindowCounter, 100, 0, time.Minute)
	head := key.AppendHead(nil, "quota", "v1")
	whole := slices.Clone(head)                             // key: [] (no hash tag)
	tagged := key.AppendTag(slices.Clone(head), 'u', "ann") // key: [user]
	other := key.AppendHead(nil, "quota-other", "v1")
	apply := func(k []byte, p *algorithm.Params, n int) {
		res := make([]algorithm.Result, 1)
		for range n {
			if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: p, Cost: 1}}}, res); err != nil || !res[0].Allowed {
				t.Fatalf("apply %s: %v %+v", k, err, res[0])
			}
		}
	}
	apply(whole, &fixed, 3)
	apply(tagged, &fixed, 2)
	apply(other, &fixed, 1)
	var got []string
	if err := st.Keys(ctx, head, func(k []byte) { got = append(got, string(k)) }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	got = slices.Compact(got)
	want := []string{string(whole), string(tagged)}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Keys(%s) = %q, want %q", head, got, want)
	}
	now := c.Now()
	start := now - now%fixed.Period
	states := make([]algorithm.State, 3)
	if err := st.ReadStates(ctx, algorithm.FixedWindow, [][]byte{whole, tagged, []byte("sl:absent:v1")}, states); err != nil {
		t.Fatal(err)
	}
	for i, w := range []algorithm.State{{T: start, V: 3}, {T: start, V: 2}, {}} {
		if states[i] != w {
			t.Fatalf("state %d = %+v, want %+v", i, states[i], w)
		}
	}
	// A sliding window counter carries the last window's count in W.
	swc := key.AppendHead(nil, "sliding", "v1")
	apply(swc, &sliding, 4)
	c.us.Add(fixed.Period)
	apply(swc, &sliding, 1)
	if err := st.ReadStates(ctx, algorithm.SlidingWindowCounter, [][]byte{swc}, states[:1]); err != nil {
		t.Fatal(err)
	}
	if w := (algorithm.State{T: start + fixed.Period, V: 1, W: 4}); states[0] != w {
		t.Fatalf("sliding state = %+v, want %+v", states[0], w)
	}
}

// TestRegionReads runs checkRegionReads on the memory store and on a Redis server.
func TestRegionReads(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
		defer mem.Close()
		checkRegionReads(t, mem, c)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		c := newClock()
		checkRegionReads(t, connect(t, "redis://"+srv.Addr, c), c)
	})
}

// checkInbox checks the region inbox on st: records read back in order after a cursor, an
// empty read keeps the cursor, and the stream stays near its bound, a cursor it trimmed past
// reading from the oldest record left.
func checkInbox(t *testing.T, st *Store) {
	t.Helper()
	ctx := context.Background()
	msgs, cur, err := st.ReadInbox(ctx, "")
	if err != nil || len(msgs) != 0 || cur != "" {
		t.Fatalf("empty inbox: read %q, cursor %q, err %v", msgs, cur, err)
	}
	in := [][]byte{[]byte("one"), {0, 1, 2, 0xff}, []byte("three")}
	if err := st.AppendInbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	msgs, cur, err = st.ReadInbox(ctx, "")
	if err != nil || len(msgs) != 3 || !slices.EqualFunc(msgs, in, bytes.Equal) {
		t.Fatalf("read %q, err %v, want %q", msgs, err, in)
	}
	first := cur
	if msgs, next, err := st.ReadInbox(ctx, cur); err != nil || len(msgs) != 0 || next != cur {
		t.Fatalf("read after the last: %q, cursor %q (want %q), err %v", msgs, next, cur, err)
	}
	if err := st.AppendInbox(ctx, [][]byte{[]byte("four")}); err != nil {
		t.Fatal(err)
	}
	if msgs, _, err := st.ReadInbox(ctx, cur); err != nil || len(msgs) != 1 || string(msgs[0]) != "four" {
		t.Fatalf("read after %s: %q, err %v, want [four]", cur, msgs, err)
	}

	// Past the bound the oldest records go, and a cursor among them reads what is left, at
	// most inboxReadCount at a time.
	many := make([][]byte, 3*inboxMaxLen)
	for i := range many {
		many[i] = []byte(strconv.Itoa(i))
	}
	if err := st.AppendInbox(ctx, many); err != nil {
		t.Fatal(err)
	}
	n, err := st.client.Do(ctx, st.client.B().Xlen().Key(st.inbox).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if n < inboxMaxLen || n > inboxMaxLen*11/10 {
		t.Fatalf("the inbox holds %d records, want about %d", n, inboxMaxLen)
	}
	msgs, _, err = st.ReadInbox(ctx, first)
	if err != nil || len(msgs) != inboxReadCount {
		t.Fatalf("read after a trimmed cursor: %d records, err %v, want %d", len(msgs), err, inboxReadCount)
	}
	if oldest, _ := strconv.Atoi(string(msgs[0])); int64(oldest) != int64(len(many))-n {
		t.Fatalf("read after a trimmed cursor starts at %q, want the oldest held, %d", msgs[0], int64(len(many))-n)
	}
}

// TestRegionInbox runs checkInbox on a Redis server and on a Cluster, where the inbox is one
// key.
func TestRegionInbox(t *testing.T) {
	t.Parallel()
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		checkInbox(t, connect(t, "redis://"+srv.Addr, newClock()))
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a 3-node Redis Cluster")
		}
		t.Parallel()
		cl := redistest.StartCluster(t, 3, 0)
		checkInbox(t, connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), newClock()))
	})
}
