package redis

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// reservation is one the differential test made: its ops (Cost what each took) and their
// instants.
type reservation struct {
	ops []store.Op
	at  []int64
}

// differentialLeases sends the same random reservations, settlements (each op given back or
// charged a random part) and checks through the memory store and st at the same instants,
// and requires identical results and, after every settlement, identical looks at every limit.
func differentialLeases(t *testing.T, st *Store, c *clock, steps int, seed uint64) {
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(seed, 28))
	ls := limits(t)
	var open []reservation
	settled, gaveBack, took := 0, 0, 0
	look := func(step int) {
		for i := range ls {
			l := &ls[i]
			b := store.Batch{Ops: []store.Op{{Key: l.key, Params: &l.params}}}
			want, got := make([]algorithm.Result, 1), make([]algorithm.Result, 1)
			mem.Apply(ctx, &b, want)
			if _, err := st.Apply(ctx, &b, got); err != nil {
				t.Fatalf("step %d: look: %v", step, err)
			}
			if got[0] != want[0] {
				t.Fatalf("step %d: after a settlement, %s %d/%dµs burst %d (key %s):\n redis  %+v\n memory %+v",
					step, l.params.Kind, l.params.Limit, l.params.Period, l.params.Burst, l.key, got[0], want[0])
			}
		}
	}
	for step := range steps {
		switch rng.IntN(8) {
		case 0:
			c.us.Add(rng.Int64N(3_000_000))
		default:
			c.us.Add(rng.Int64N(20_000))
		}
		if len(open) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(open))
			r := open[k]
			open = append(open[:k], open[k+1:]...)
			ops := make([]store.Op, len(r.ops))
			copy(ops, r.ops)
			for i := range ops {
				used := rng.Int64N(ops[i].Cost + 4)
				ops[i].Cost -= used // > 0 gives back, < 0 takes more
				if ops[i].Cost > 0 {
					gaveBack++
				} else if ops[i].Cost < 0 {
					took++
				}
			}
			if err := mem.Adjust(ctx, ops, r.at); err != nil {
				t.Fatal(err)
			}
			if err := st.Adjust(ctx, ops, r.at); err != nil {
				t.Fatalf("step %d: adjust: %v", step, err)
			}
			settled++
			look(step)
			continue
		}
		var b store.Batch
		for range 1 + rng.IntN(3) {
			l := &ls[rng.IntN(len(ls))]
			b.Ops = append(b.Ops, store.Op{Key: l.key, Params: &l.params, Cost: rng.Int64N(6)})
		}
		b.OpAt = make([]int64, len(b.Ops))
		want := make([]algorithm.Result, len(b.Ops))
		got := make([]algorithm.Result, len(b.Ops))
		mem.Apply(ctx, &b, want)
		memAt := append([]int64(nil), b.OpAt...)
		if _, err := st.Apply(ctx, &b, got); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		allowed := true
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("step %d op %d: redis %+v, memory %+v", step, i, got[i], want[i])
			}
			allowed = allowed && got[i].Allowed
			if b.OpAt[i] != memAt[i] {
				t.Fatalf("step %d op %d: decided at %d, memory at %d", step, i, b.OpAt[i], memAt[i])
			}
		}
		if allowed {
			open = append(open, reservation{ops: b.Ops, at: b.OpAt})
		}
	}
	if settled < steps/10 || gaveBack == 0 || took == 0 {
		t.Fatalf("settlements untested: %d settled, %d give-backs, %d takes", settled, gaveBack, took)
	}
	t.Logf("%d steps: %d settlements, %d ops given back, %d charged more", steps, settled, gaveBack, took)
}

func TestLeaseSettlementsMatchMemory(t *testing.T) {
	t.Parallel()
	eachScriptMode(t, func(t *testing.T, st *Store, c *clock) {
		differentialLeases(t, st, c, 1500, 3)
		checkLeaseRecords(t, st, c)
	})
}

// TestLeaseSettlementsCluster settles reservations whose limits span a 3-node Cluster's slots.
func TestLeaseSettlementsCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	c := newClock()
	st := connect(t, "redis-cluster://"+strings.Join(cl.Addrs, ","), c)
	differentialLeases(t, st, c, 800, 4)
	checkLeaseRecords(t, st, c)
}

func TestLeaseRecordsMemory(t *testing.T) {
	t.Parallel()
	c := newClock()
	mem := memory.New(memory.WithClock(c.Now), memory.WithSweepInterval(0))
	defer mem.Close()
	checkLeaseRecords(t, mem, c)
}

// checkLeaseRecords checks store.Leaser's records on st: a lease settles once, a repeat
// answers the first settlement, an unknown or expired one is ErrUnknownLease.
func checkLeaseRecords(t *testing.T, st store.Leaser, c *clock) {
	t.Helper()
	id := []byte("lease-" + time.Now().Format("150405.000000"))
	rec := []byte("rec\x00with|bytes")
	if err := st.PutLease(ctx, id, rec, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		used  int64
		first bool
	}{{3, true}, {3, false}, {7, false}} {
		got, used, first, err := st.SettleLease(ctx, id, want.used)
		if err != nil || string(got) != string(rec) || used != 3 || first != want.first {
			t.Fatalf("settlement %d with %d: rec %q used %d first %v err %v; want %q 3 %v", i, want.used, got, used, first, err, rec, want.first)
		}
	}
	if _, _, _, err := st.SettleLease(ctx, []byte("never-issued"), 1); !errors.Is(err, store.ErrUnknownLease) {
		t.Fatalf("unknown lease: %v, want ErrUnknownLease", err)
	}
	// Renewing: an unsettled lease lives on past its first ttl; a settled one refuses.
	renewed := append(append([]byte(nil), id...), "-renewed"...)
	if err := st.PutLease(ctx, renewed, rec, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got, err := st.RenewLease(ctx, renewed, 10*time.Second); err != nil || string(got) != string(rec) {
		t.Fatalf("renew: rec %q, %v; want %q", got, err, rec)
	}
	c.us.Add(200_000)
	time.Sleep(300 * time.Millisecond) // past the first ttl on Redis's clock too
	if _, _, first, err := st.SettleLease(ctx, renewed, 1); err != nil || !first {
		t.Fatalf("a renewed lease past its first ttl: first %v, %v", first, err)
	}
	if _, err := st.RenewLease(ctx, renewed, time.Second); !errors.Is(err, store.ErrLeaseSettled) {
		t.Fatalf("renew a settled lease: %v, want ErrLeaseSettled", err)
	}
	if _, err := st.RenewLease(ctx, []byte("never-issued"), time.Second); !errors.Is(err, store.ErrUnknownLease) {
		t.Fatalf("renew an unknown lease: %v, want ErrUnknownLease", err)
	}
	short := append(append([]byte(nil), id...), "-short"...)
	if err := st.PutLease(ctx, short, rec, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c.us.Add(60_000) // the memory store's clock; Redis expires by its own
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, _, err := st.SettleLease(ctx, short, 1)
		if errors.Is(err, store.ErrUnknownLease) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lease of 50ms still settles after 10s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
