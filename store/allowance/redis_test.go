package allowance

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// TestNodesOnRedis has two nodes with allowances, each with concurrent callers, spend a user's,
// a tenant's and a global limit on one Redis until each caller was refused many times. Between
// them they never admit past a limit, they admit all but what each could still hold, most
// requests are decided from held units, and once both close Redis counts exactly what they
// admitted: every unit held went back (by the instant the plain window path reported too). On a
// single server and on a 3-primary Cluster, where the three keys live on different nodes.
func TestNodesOnRedis(t *testing.T) {
	t.Run("server", func(t *testing.T) { nodesOn(t, "redis://"+redistest.Start(t).Addr) })
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a 3-node Redis Cluster")
		}
		cl := redistest.StartCluster(t, 3, 0)
		nodesOn(t, "redis-cluster://"+strings.Join(cl.Addrs, ","))
	})
}

// nodesOn is TestNodesOnRedis on the store at url.
func nodesOn(t *testing.T, url string) {
	day := 24 * time.Hour
	user := params(t, algorithm.FixedWindow, 2000, day)
	tenant := params(t, algorithm.FixedWindow, 5000, day)
	global := params(t, algorithm.FixedWindow, 100_000, day)
	ops := func() []store.Op {
		return []store.Op{
			{Key: []byte("user"), Params: user, Cost: 1},
			{Key: []byte("tenant"), Params: tenant, Cost: 1},
			{Key: []byte("global"), Params: global, Cost: 1},
		}
	}
	window := time.Now().UTC().Truncate(day)
	open := func() *redis.Store {
		r, err := redis.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	nodes := []*Store{}
	for range 2 {
		n, err := New(open(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, n := range nodes {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for refused := 0; refused < 20; {
					res := make([]algorithm.Result, 3)
					if _, err := n.Apply(ctx, &store.Batch{Ops: ops()}, res); err != nil {
						t.Error(err)
						return
					}
					if allowed(res) {
						admitted.Add(1)
					} else {
						refused++
					}
				}
			}()
		}
	}
	wg.Wait()
	stats := []Stats{nodes[0].Stats(), nodes[1].Stats()}
	for _, n := range nodes {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !time.Now().UTC().Truncate(day).Equal(window) {
		t.Skip("the day's window turned over during the run")
	}
	got := admitted.Load()
	if got > user.Limit {
		t.Fatalf("admitted %d past the user's limit of %d", got, user.Limit)
	}
	// Each node holds less than two grants when the store refuses the other.
	if slack := 2 * 2 * user.Limit / 32; got < user.Limit-slack {
		t.Fatalf("admitted %d of %d: more than the %d the nodes could hold went unspent", got, user.Limit, slack)
	}
	if local := stats[0].Local + stats[1].Local; local < got/2 {
		t.Fatalf("%d of %d admissions were decided from held units: %+v", local, got, stats)
	}
	bare := open()
	defer bare.Close()
	for _, op := range ops() {
		if left := look(t, bare, string(op.Key), op.Params); left != op.Params.Limit-got {
			t.Errorf("%s: Redis has %d left after %d admissions of %d: units held were lost", op.Key, left, got, op.Params.Limit)
		}
	}
}
