package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
)

// TestKeyPrefix: with key_prefix, every key the store writes (bucket state, a log list, an
// idempotency record) starts with it, on a single server and on a Cluster, and Reset and
// Keys find them; another store on the same Redis without it keeps its own counts.
func TestKeyPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cluster bool
	}{{"single server", false}, {"cluster", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var addr string
			if tc.cluster {
				if testing.Short() {
					t.Skip("a Cluster takes seconds to start")
				}
				addr = "redis-cluster://" + redistest.StartCluster(t, 3, 0).Nodes[0].Addr
			} else {
				addr = "redis://" + redistest.Start(t).Addr
			}
			sep := "?"
			if strings.Contains(addr, "?") {
				sep = "&"
			}
			c := newClock()
			prefixed := connect(t, addr+sep+"key_prefix=team-a_", c)
			plain := connect(t, addr, c)
			scan := func() []string { return storedKeys(t, plain) }

			fw, _ := algorithm.NewParams(algorithm.FixedWindow, 2, 0, time.Minute)
			swl, _ := algorithm.NewParams(algorithm.SlidingWindowLog, 2, 0, time.Minute)
			k1 := key.AppendHead(nil, "rule", "1")
			k2 := key.AppendTag(key.AppendHead(nil, "log", "1"), 'u', "alice")
			batch := func() *store.Batch {
				return &store.Batch{Ops: []store.Op{{Key: k1, Params: &fw, Cost: 1}, {Key: k2, Params: &swl, Cost: 1}}}
			}
			res := make([]algorithm.Result, 2)
			for i := range 3 {
				if _, err := prefixed.Apply(ctx, batch(), res); err != nil {
					t.Fatal(err)
				}
				if res[0].Allowed != (i < 2) {
					t.Fatalf("prefixed request %d allowed=%v", i, res[0].Allowed)
				}
			}
			// The same bucket keys without the prefix are other keys.
			if _, err := plain.Apply(ctx, batch(), res); err != nil || !res[0].Allowed || res[0].Remaining != 1 {
				t.Fatalf("unprefixed store: %+v, %v; want its own fresh count", res[0], err)
			}
			k3 := key.AppendTag(key.AppendHead(nil, "rule", "2"), 'u', "bob")
			idem := &store.Batch{Ops: []store.Op{{Key: k3, Params: &fw, Cost: 1}}}
			idem.IdempotencyKey, idem.IdempotencyTTL = []byte("{u:bob}retry-1"), time.Minute
			if _, err := prefixed.Apply(ctx, idem, res); err != nil {
				t.Fatal(err)
			}

			var withPrefix, without int
			for _, k := range scan() {
				if strings.HasPrefix(k, "team-a_") {
					withPrefix++
				} else {
					without++
				}
			}
			// Prefixed: three states, a log list, an idempotency record (one per slot of the
			// request on a Cluster); unprefixed: the plain store's two states and its log.
			if withPrefix < 5 || without != 3 {
				t.Fatalf("keys with the prefix %d (want >= 5), without %d (want 3): %q", withPrefix, without, scan())
			}

			var listed []string
			if err := prefixed.Keys(ctx, []byte(key.Prefix), func(k []byte) {
				if !strings.Contains(string(k), "idem3:") { // a single server's records start with sl: too
					listed = append(listed, string(k))
				}
			}); err != nil {
				t.Fatal(err)
			}
			if len(listed) != 3 {
				t.Fatalf("Keys listed %q, want the 3 bucket keys", listed)
			}
			if err := prefixed.Reset(ctx, [][]byte{k1, k2}); err != nil {
				t.Fatal(err)
			}
			if _, err := prefixed.Apply(ctx, batch(), res); err != nil || !res[0].Allowed || res[0].Remaining != 1 {
				t.Fatalf("after Reset: %+v, %v; want a fresh count", res[0], err)
			}
		})
	}
	if _, _, err := parseURL("redis://127.0.0.1:1?key_prefix=%7Bx%7D"); err == nil || !strings.Contains(err.Error(), "key_prefix") {
		t.Fatalf("a prefix with braces: err = %v", err)
	}
}

// storedKeys lists every key held on every server st reaches.
func storedKeys(t *testing.T, st *Store) []string {
	t.Helper()
	var all []string
	for addr, n := range st.client.Nodes() {
		ks, err := n.Do(ctx, n.B().Keys().Pattern("*").Build()).AsStrSlice()
		if err != nil {
			t.Fatalf("KEYS on %s: %v", addr, err)
		}
		all = append(all, ks...)
	}
	return all
}
