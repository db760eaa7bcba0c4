package redis

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
)

// TestClusterPlainWindowsMoveSlot: two nodes count a request's two fixed windows, on one slot,
// with plain commands on a Cluster (Redis's own clock), while the slot moves to another
// primary, keys and all, in batches. Between batches, the key may be on either node: a count
// the old owner refuses (ASK, then MOVED) falls back to the script, which follows the
// redirection, and the nodes read the slot map again. Racers go past the smaller limit. Nothing
// is admitted past it, every unit admitted is the count Redis holds on the new owner (no count
// made twice or given back wrongly, denials consumed nothing), all of the limit is admitted,
// and plain commands count on the new owner once it serves the slot.
func TestClusterPlainWindowsMoveSlot(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	nodes := twoNodes(t, "redis-cluster://"+strings.Join(cl.Addrs, ","))
	const limit = 3000
	small, _ := algorithm.NewParams(algorithm.FixedWindow, limit, 0, longWindow)
	big, _ := algorithm.NewParams(algorithm.FixedWindow, 1<<40, 0, longWindow)
	user := key.AppendTag(key.AppendHead(nil, "moving-user", "v1"), 'u', "ann")
	slot := Slot(user)
	tenant := sameSlot(t, slot, func(i int) []byte {
		return key.AppendTag(key.AppendHead(nil, "moving-tenant", "v1"), 'u', fmt.Sprint("t", i))
	})
	from := cl.Owner(t, int(slot))
	to := cl.Nodes[0]
	if to == from {
		to = cl.Nodes[1]
	}
	// Keys of others on the slot, so that it moves in several batches: the user's hash tag
	// puts them there.
	userKey := redisKey(user)
	open, end := strings.IndexByte(userKey, '{'), strings.IndexByte(userKey, '}')
	if open < 0 || end < open {
		t.Fatalf("no hash tag in %q", userKey)
	}
	for i := range 300 {
		if _, err := from.Do("SET", fmt.Sprintf("%sfiller-%d", userKey[open:end+1], i), "x"); err != nil {
			t.Fatal(err)
		}
	}

	var admitted, tries atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]algorithm.Result, 2)
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := store.Batch{Ops: []store.Op{{Key: user, Params: &small, Cost: 1}, {Key: tenant, Params: &big, Cost: 1}}}
				if _, err := nodes[w%2].Apply(ctx, &b, res); err != nil {
					t.Error(err)
					return
				}
				tries.Add(1)
				if res[0].Allowed && res[1].Allowed {
					admitted.Add(1)
				}
				time.Sleep(time.Millisecond) // so that the limit lasts past the move
			}
		}()
	}
	decided := func() (n uint64) {
		for _, st := range nodes {
			d, _ := st.PlainStats()
			n += d
		}
		return n
	}
	waitFor(t, func() error {
		if admitted.Load() < 200 {
			return fmt.Errorf("%d admitted before the move", admitted.Load())
		}
		return nil
	})
	if decided() == 0 {
		t.Fatal("plain commands decided nothing on the Cluster")
	}
	cl.MoveSlot(t, int(slot), to, 10, func() { time.Sleep(5 * time.Millisecond) })
	movedAt := decided()
	waitFor(t, func() error {
		for i, st := range nodes {
			if r := st.routes.Load(); r == nil || r[slot] == nil || r[slot].addr != to.Addr {
				return fmt.Errorf("node %d does not route the slot to its new owner %s", i, to.Addr)
			}
		}
		if d := decided(); d < movedAt+50 {
			return fmt.Errorf("%d batches decided plain since the move", d-movedAt)
		}
		return nil
	})
	waitFor(t, func() error {
		if admitted.Load() < limit || tries.Load() < limit+200 {
			return fmt.Errorf("%d tries, %d admitted", tries.Load(), admitted.Load())
		}
		return nil
	})
	close(stop)
	wg.Wait()

	for i, st := range nodes {
		if got := st.Stats().RoutedSlots; got != 16384 {
			t.Errorf("node %d routes %d slots, want 16384", i, got)
		}
	}
	if nodes[0].Stats().Redirects+nodes[1].Stats().Redirects == 0 {
		t.Fatal("no flight met the move: the old owner redirected nothing")
	}
	n := admitted.Load()
	heldUser, heldTenant := windowCount(t, to, userKey), windowCount(t, to, redisKey(tenant))
	t.Logf("%d tries, %d admitted; the new owner holds %d and %d", tries.Load(), n, heldUser, heldTenant)
	if n != limit || heldUser != n || heldTenant != n {
		t.Fatalf("%d admitted against a limit of %d; the new owner holds %d and %d", n, limit, heldUser, heldTenant)
	}
}

// sameSlot returns the first of build(0), build(1), ... that hashes to slot.
func sameSlot(t *testing.T, slot uint16, build func(int) []byte) []byte {
	t.Helper()
	for i := range 1 << 22 {
		if k := build(i); Slot(k) == slot {
			return k
		}
	}
	t.Fatalf("no key found for slot %d", slot)
	return nil
}

// TestClusterPlainWindowsFailover: a primary that plain windows count on dies, and its replica
// takes over. Checks on its slots fail meanwhile (as the script's would), and afterwards plain
// commands count on the new primary without a restart: the failed flights read the slot map
// again.
func TestClusterPlainWindowsFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 1)
	st, err := New(ctx, "redis-cluster://"+strings.Join(cl.Addrs, ","), WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	wide, _ := algorithm.NewParams(algorithm.FixedWindow, 1<<40, 0, longWindow)
	user := key.AppendTag(key.AppendHead(nil, "failover-user", "v1"), 'u', "ann")
	slot := Slot(user)
	res := make([]algorithm.Result, 1)
	hit := func() error {
		_, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: user, Params: &wide, Cost: 1}}}, res)
		return err
	}
	decided := func() uint64 { d, _ := st.PlainStats(); return d }
	waitFor(t, func() error {
		if err := hit(); err != nil {
			return err
		}
		if decided() == 0 {
			return fmt.Errorf("no plain decision yet")
		}
		return nil
	})
	old := cl.Owner(t, int(slot))
	old.Kill()
	cl.WaitOK(t)
	primary := cl.Owner(t, int(slot))
	if primary == old {
		t.Fatalf("slot %d still on the killed node %s", slot, old.Addr)
	}
	before := decided()
	waitFor(t, func() error {
		if err := hit(); err != nil {
			return err
		}
		if r := st.routes.Load(); r == nil || r[slot] == nil || r[slot].addr != primary.Addr {
			return fmt.Errorf("the slot is not routed to its new primary %s", primary.Addr)
		}
		if decided() == before {
			return fmt.Errorf("no plain decision on the new primary")
		}
		return nil
	})
}
