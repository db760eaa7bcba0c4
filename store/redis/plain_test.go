package redis

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// windowLimits are fixed windows of the shapes the fast path takes (small limits, so that
// traffic crosses them often) and one it never takes (a window of a millisecond and a half).
func windowLimits(t testing.TB) []limit {
	var ls []limit
	for i, spec := range []struct {
		n      int64
		period time.Duration
	}{{3, time.Second}, {10, time.Second}, {40, time.Minute}, {5, 20 * time.Millisecond}, {4, 1500 * time.Microsecond}} {
		p, err := algorithm.NewParams(algorithm.FixedWindow, spec.n, 0, spec.period)
		if err != nil {
			t.Fatal(err)
		}
		for u := range 2 {
			k := key.AppendTag(key.AppendHead(nil, fmt.Sprintf("win%d", i), "v1"), 'u', fmt.Sprint("user", u))
			ls = append(ls, limit{key: k, params: p})
		}
		ls = append(ls, limit{key: key.AppendHead(nil, fmt.Sprintf("win%d-global", i), "v1"), params: p})
	}
	return ls
}

// TestPlainWindowsMatchMemory sends random fixed-window traffic through two nodes on one Redis
// (so that each meets counts the other made, as a fleet does) and the memory store at the same
// instants, and requires the same results: the fast path, the script, and the fall back from
// one to the other (a count over its limit, a window edge) decide as the memory store does.
func TestPlainWindowsMatchMemory(t *testing.T) {
	t.Parallel()
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		matchMemory(t, "redis://"+redistest.Start(t).Addr)
	})
	// On a Cluster a request's limits sit on several slots: a batch per slot, and the
	// batches of one primary share its flight.
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("starts a 3-node Redis Cluster")
		}
		matchMemory(t, "redis-cluster://"+strings.Join(redistest.StartCluster(t, 3, 0).Addrs, ","))
	})
}

// matchMemory is TestPlainWindowsMatchMemory on the Redis at url.
func matchMemory(t *testing.T, url string) {
	c := newClock()
	nodes := []*Store{connect(t, url, c), connect(t, url, c)}
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(31, 1))
	ls := windowLimits(t)
	for step := range 4000 {
		switch rng.IntN(12) {
		case 0: // near a window's edge, either side of it
			period := ls[rng.IntN(len(ls))].params.Period
			next := (c.Now()/period + 1) * period
			c.us.Store(max(c.Now(), next-6000+rng.Int64N(12000)))
		case 1:
			c.us.Add(rng.Int64N(2_000_000))
		default:
			c.us.Add(rng.Int64N(5_000))
		}
		var b store.Batch
		for range 1 + rng.IntN(3) {
			l := &ls[rng.IntN(len(ls))]
			b.Ops = append(b.Ops, store.Op{Key: l.key, Params: &l.params, Cost: 1 + rng.Int64N(3), Shadow: rng.IntN(10) == 0})
		}
		want := make([]algorithm.Result, len(b.Ops))
		got := make([]algorithm.Result, len(b.Ops))
		if _, err := mem.Apply(ctx, &b, want); err != nil {
			t.Fatal(err)
		}
		if _, err := nodes[rng.IntN(2)].Apply(ctx, &b, got); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range want {
			if got[i] != want[i] {
				op := b.Ops[i]
				t.Fatalf("step %d op %d (limit %d per %dµs, cost %d, shadow %v, key %s):\n redis  %+v\n memory %+v",
					step, i, op.Params.Limit, op.Params.Period, op.Cost, op.Shadow, op.Key, got[i], want[i])
			}
		}
	}
	var decided, fellBack uint64
	for i, n := range nodes {
		d, f := n.PlainStats()
		t.Logf("node %d: %d batches decided plain, %d fell back to the script", i, d, f)
		decided, fellBack = decided+d, fellBack+f
	}
	if decided < 500 || fellBack < 20 {
		t.Fatalf("the fast path decided %d batches and fell back %d times: want both taken", decided, fellBack)
	}
}

// TestPlainWindowsExactAcrossNodes: two nodes on Redis's own clock, 24 callers racing on a
// user's limit and a global one, far from and then past both; with small limits the racers
// cross them within one round trip, so increments go over and fall back. Nothing is admitted
// past either limit, every unit admitted is the count Redis holds (the fall backs gave back
// what they counted, and denials consumed nothing), and each limit admits all it holds when no
// window edge fell inside the test.
func TestPlainWindowsExactAcrossNodes(t *testing.T) {
	t.Parallel()
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		exactAcrossNodes(t, "redis://"+srv.Addr, func([]byte) *redistest.Server { return srv })
	})
	// On a Cluster the users and the global limit sit on different slots and primaries: each
	// request is two batches, and a primary's flights carry many slots.
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("starts a 3-node Redis Cluster")
		}
		cl := redistest.StartCluster(t, 3, 0)
		exactAcrossNodes(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), func(k []byte) *redistest.Server { return cl.Owner(t, int(Slot(k))) })
	})
}

// exactAcrossNodes is TestPlainWindowsExactAcrossNodes on the Redis at url, where owner(k) is
// the server that holds k.
func exactAcrossNodes(t *testing.T, url string, owner func(k []byte) *redistest.Server) {
	nodes := twoNodes(t, url)
	var fellBack uint64
	for _, tc := range []struct{ user, global int64 }{{300, 1000}, {6, 20}} {
		userP, _ := algorithm.NewParams(algorithm.FixedWindow, tc.user, 0, longWindow)
		globalP, _ := algorithm.NewParams(algorithm.FixedWindow, tc.global, 0, longWindow)
		name := fmt.Sprintf("exact%d", tc.global)
		var users [][]byte
		for _, u := range []string{"a", "b", "c", "d"} {
			users = append(users, key.AppendTag(key.AppendHead(nil, name+"-user", "v1"), 'u', u))
		}
		global := key.AppendHead(nil, name+"-global", "v1")
		before := redisHour(t, owner(global))
		var allowed [4]atomic.Int64
		var wg sync.WaitGroup
		for w := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]algorithm.Result, 2)
				for i := range 120 {
					u := (w + i) % len(users)
					b := store.Batch{Ops: []store.Op{{Key: users[u], Params: &userP, Cost: 1}, {Key: global, Params: &globalP, Cost: 1}}}
					if _, err := nodes[w%2].Apply(ctx, &b, res); err != nil {
						t.Error(err)
						return
					}
					if res[0].Allowed && res[1].Allowed {
						allowed[u].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		sameHour := redisHour(t, owner(global)) == before
		total := int64(0)
		for u := range users {
			n := allowed[u].Load()
			total += n
			held := windowCount(t, owner(users[u]), redisKey(users[u]))
			if n > userP.Limit || held != n {
				t.Errorf("%s user %d: %d admitted, Redis holds %d, limit %d", name, u, n, held, userP.Limit)
			}
		}
		if held := windowCount(t, owner(global), redisKey(global)); total > globalP.Limit || held != total {
			t.Errorf("%s global: %d admitted, Redis holds %d, limit %d", name, total, held, globalP.Limit)
		}
		if sameHour && total != globalP.Limit {
			t.Errorf("%s global: %d admitted of %d asked against a limit of %d", name, total, 24*120, globalP.Limit)
		}
		var decided uint64
		fellBack = 0
		for _, n := range nodes {
			d, f := n.PlainStats()
			decided, fellBack = decided+d, fellBack+f
		}
		t.Logf("%s: %d admitted; so far %d batches decided plain, %d fell back", name, total, decided, fellBack)
		if decided == 0 {
			t.Fatal("the fast path decided nothing")
		}
	}
	if fellBack == 0 {
		t.Fatal("no racer went over a limit: the fall back is untested here")
	}
}

// twoNodes connects two stores to url, on Redis's own clock, as two nodes of a fleet.
func twoNodes(t *testing.T, url string) []*Store {
	t.Helper()
	var nodes []*Store
	for range 2 {
		st, err := New(ctx, url, WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		nodes = append(nodes, st)
	}
	return nodes
}

// TestPlainWindowsWrongClock: a node whose bound of Redis's clock is a window behind sends its
// increments for a window that is over; one whose clock stepped (so that the bound runs a
// window ahead) sends them for a window not begun. The TIMEs around them show it, the
// increments are given back and the script decides: nothing is left counted in the window
// guessed, and the window's count is what was admitted.
func TestPlainWindowsWrongClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		st, err := New(ctx, "redis://"+srv.Addr, WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		p, _ := algorithm.NewParams(algorithm.FixedWindow, 5, 0, time.Hour)
		k := key.AppendTag(key.AppendHead(nil, "skewed", "v1"), 'u', skew.String())
		res := make([]algorithm.Result, 1)
		apply := func() {
			t.Helper()
			if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed {
				t.Fatalf("skew %v: denied: %+v", skew, res[0])
			}
		}
		apply() // by the script: the node knows nothing of Redis's clock yet
		for i := range 3 {
			st.clock.at.Add(skew.Microseconds())
			apply()
			if _, f := st.PlainStats(); f != uint64(i+1) {
				t.Fatalf("skew %v: after %d skewed requests, %d fell back", skew, i+1, f)
			}
		}
		if d, _ := st.PlainStats(); d != 0 {
			t.Fatalf("skew %v: %d decided plain", skew, d)
		}
		apply() // the bound is right again: the fast path
		if d, _ := st.PlainStats(); d != 1 {
			t.Fatalf("skew %v: %d decided plain, want 1", skew, d)
		}
		if n := windowCount(t, srv, redisKey(k)); n != 5 {
			t.Fatalf("skew %v: the key holds a count of %d, want 5", skew, n)
		}
	}
}

// TestFixedWindowStringState: a key still holding the "t:v:w" string of a version before the
// hash is read as that count, by the script and by the fast path (which falls back on it), and
// written back as the hash.
func TestFixedWindowStringState(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"plain", nil}, {"script", []Option{WithPlainWindows(false)}}} {
		st := connect(t, "redis://"+srv.Addr, c, mode.opts...)
		p, _ := algorithm.NewParams(algorithm.FixedWindow, 10, 0, time.Minute)
		k := key.AppendTag(key.AppendHead(nil, "legacy-"+mode.name, "v1"), 'u', "a")
		start := c.Now() - c.Now()%p.Period
		if _, err := srv.Do("SET", redisKey(k), strconv.FormatInt(start, 10)+":7:0"); err != nil {
			t.Fatal(err)
		}
		res := make([]algorithm.Result, 1)
		for range 2 { // the first teaches the node Redis's clock (here the test's)
			if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res); err != nil {
				t.Fatal(err)
			}
		}
		if !res[0].Allowed || res[0].Remaining != 1 || windowCount(t, srv, redisKey(k)) != 9 {
			t.Fatalf("%s: %+v, Redis holds %d: want 9 counted", mode.name, res[0], windowCount(t, srv, redisKey(k)))
		}
	}
}

// windowCount is the count a fixed window's hash holds: its windows' counts, summed (a window
// an increment came to late holds 0 once given back), 0 for no key.
// TestPlainWindowsReportTheirInstant: a batch that asks each op's instant (Batch.OpAt) is
// still counted with plain commands, and the instant it gets is in the window the count went
// to, so a give-back that names it (node allowances' give-back) reaches that count.
func TestPlainWindowsReportTheirInstant(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 100, 0, time.Minute)
	k := key.AppendTag(key.AppendHead(nil, "instant", "v1"), 'u', "a")
	res := make([]algorithm.Result, 1)
	b := &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 5}}, OpAt: make([]int64, 1)}
	if _, err := st.Apply(ctx, b, res); err != nil || !res[0].Allowed { // the script: the node learns the clock
		t.Fatalf("%+v, %v", res[0], err)
	}
	before, _ := st.PlainStats()
	if _, err := st.Apply(ctx, b, res); err != nil || !res[0].Allowed {
		t.Fatalf("%+v, %v", res[0], err)
	}
	if after, _ := st.PlainStats(); after != before+1 {
		t.Fatalf("a batch asking its instants was not counted with plain commands (%d, then %d)", before, after)
	}
	end := c.Now() - c.Now()%p.Period + p.Period
	if got := b.OpAt[0] + res[0].ResetAfter; got != end {
		t.Fatalf("instant %d and reset_after %d name the window ending at %d, want %d", b.OpAt[0], res[0].ResetAfter, got, end)
	}
	if err := st.Adjust(ctx, []store.Op{{Key: k, Params: &p, Cost: 5}}, b.OpAt); err != nil {
		t.Fatal(err)
	}
	if n := windowCount(t, srv, redisKey(k)); n != 5 {
		t.Fatalf("the key holds %d after two requests of 5 and a give-back of 5", n)
	}
}

func windowCount(t *testing.T, srv *redistest.Server, k string) int64 {
	t.Helper()
	v, err := srv.Do("EVAL", "local n = 0 for _, c in ipairs(redis.call('HVALS', KEYS[1])) do n = n + tonumber(c) end return n", "1", k)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// redisHour is Redis's clock, in hours.
func redisHour(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do("EVAL", "return redis.call('TIME')[1]", "0")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := strconv.ParseInt(v, 10, 64)
	return s / 3600
}

// TestPlainWindowsKeepExpiry: every key the fast path counts expires with its window, the
// first time (its PEXPIREAT) and after the key went mid-window (a reset), when this node
// no longer sends one: the fresh count on a key it had given its expiry repairs it.
func TestPlainWindowsKeepExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClock()
	st := connect(t, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.FixedWindow, 100, 0, time.Minute)
	k := key.AppendTag(key.AppendHead(nil, "expiry", "v1"), 'u', "a")
	res := make([]algorithm.Result, 1)
	apply := func() {
		t.Helper()
		if _, err := st.Apply(ctx, &store.Batch{Ops: []store.Op{{Key: k, Params: &p, Cost: 1}}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%+v, %v", res[0], err)
		}
	}
	end := c.Now() - c.Now()%p.Period + p.Period
	expiresAt := func(what string) {
		t.Helper()
		at, err := srv.Do("PEXPIRETIME", redisKey(k))
		if err != nil || at != strconv.FormatInt((end-1)/1000, 10) {
			t.Fatalf("%s: the key expires at %s (%v), want the window's last millisecond %d", what, at, err, (end-1)/1000)
		}
	}
	apply() // the script: the node learns the (test's) clock
	for range 3 {
		apply()
	}
	expiresAt("counted")
	if err := st.Reset(ctx, [][]byte{k}); err != nil {
		t.Fatal(err)
	}
	before, _ := st.PlainStats()
	apply()
	if after, _ := st.PlainStats(); after != before+1 {
		t.Fatalf("the count after the reset was not the fast path's (%d, then %d)", before, after)
	}
	expiresAt("counted after a reset")
	if n := windowCount(t, srv, redisKey(k)); n != 1 {
		t.Fatalf("the key holds %d after the reset and one request", n)
	}
}
