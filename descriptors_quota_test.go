package sluice_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

const quotaDomain = `
domain: ai
descriptors:
  - key: backend
    value: a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: backend
    value: b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// TestQuotaModeOnStores plays quota_mode requests on the memory store and on a real Redis:
// the request fails only when every quota descriptor is over, and a denied request consumes
// nothing, quota descriptors included, on either store.
func TestQuotaModeOnStores(t *testing.T) {
	t.Parallel()
	cfg, err := envoyconf.Load(map[string][]byte{"ai.yaml": []byte(quotaDomain)}, false)
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) sluice.Store{
		"memory": func(*testing.T) sluice.Store { return memory.New(memory.WithSweepInterval(0)) },
		"redis": func(t *testing.T) sluice.Store {
			srv := redistest.Start(t)
			st, err := redis.New(context.Background(), "redis://"+srv.Addr, redis.WithTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim, err := sluice.New(open(t), testutil.Snapshot(t, "rules: []\n").WithEnvoy(cfg, "v1"))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			user := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "user", Value: "alice"}}}
			backend := func(v string) sluice.Descriptor {
				return sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "backend", Value: v}}}
			}
			steps := []struct {
				descs []sluice.Descriptor
				ok    bool
				// statuses OK and remaining, per descriptor
				each      []bool
				remaining []uint32
			}{
				{[]sluice.Descriptor{user, backend("a"), backend("b")}, true, []bool{true, true, true}, []uint32{9, 0, 1}},
				// a over, b not: allowed, user and b consume, a does not.
				{[]sluice.Descriptor{user, backend("a"), backend("b")}, true, []bool{true, false, true}, []uint32{8, 0, 0}},
				// Both over: denied; user keeps its 8.
				{[]sluice.Descriptor{user, backend("a"), backend("b")}, false, []bool{true, false, false}, []uint32{8, 0, 0}},
				// Quota descriptors alone, both over: denied, nothing consumed anywhere.
				{[]sluice.Descriptor{backend("b"), backend("a")}, false, []bool{false, false}, []uint32{0, 0}},
				{[]sluice.Descriptor{user}, true, []bool{true}, []uint32{7}},
			}
			for i, s := range steps {
				var d sluice.DescriptorDecision
				if err := lim.CheckDescriptors(context.Background(), &sluice.DescriptorRequest{Domain: "ai", Descriptors: s.descs}, &d); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d.OK != s.ok || d.Degraded {
					t.Errorf("step %d: ok=%v degraded=%v, want ok=%v", i, d.OK, d.Degraded, s.ok)
				}
				for j, st := range d.Statuses {
					if st.OK != s.each[j] || st.Remaining != s.remaining[j] {
						t.Errorf("step %d descriptor %d: ok=%v remaining=%d, want ok=%v remaining=%d", i, j, st.OK, st.Remaining, s.each[j], s.remaining[j])
					}
				}
			}
		})
	}
}

// TestGlobalQuotaMode: WithEnvoyQuotaMode (QUOTA_MODE) puts every Envoy-format limit in
// quota_mode, per-request limits included, on the memory store and on a real Redis alike;
// without it the same requests are denied by the first limit over.
func TestGlobalQuotaMode(t *testing.T) {
	t.Parallel()
	cfg, err := envoyconf.Load(map[string][]byte{"ai.yaml": []byte(`
domain: ai
descriptors:
  - key: backend
    value: a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: backend
    value: b
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: backend
    value: c
    rate_limit: {unit: hour, requests_per_unit: 5}
`)}, false)
	if err != nil {
		t.Fatal(err)
	}
	backend := func(v string) sluice.Descriptor {
		return sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "backend", Value: v}}}
	}
	override := sluice.Descriptor{Entries: []envoyconf.Entry{{Key: "backend", Value: "o"}}, Limit: &sluice.DescriptorLimit{RequestsPerUnit: 1, Unit: "hour"}}
	steps := []struct {
		descs       []sluice.Descriptor
		quota, base bool // the request's OK with and without the global quota mode
	}{
		{[]sluice.Descriptor{backend("a"), backend("b")}, true, true},
		// a over, b not: in quota mode allowed, b consumes; otherwise denied, nothing consumed.
		{[]sluice.Descriptor{backend("a"), backend("b")}, true, false},
		{[]sluice.Descriptor{backend("b")}, false, true},
		{[]sluice.Descriptor{override, backend("c")}, true, true},
		// The per-request limit is over: a quota too under the global mode.
		{[]sluice.Descriptor{override, backend("c")}, true, false},
	}
	for _, store := range []string{"memory", "redis"} {
		for _, global := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/quota_mode=%v", store, global), func(t *testing.T) {
				t.Parallel()
				var st sluice.Store = memory.New(memory.WithSweepInterval(0))
				if store == "redis" {
					srv := redistest.Start(t)
					rs, err := redis.New(context.Background(), "redis://"+srv.Addr, redis.WithTimeout(2*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					st = rs
				}
				var opts []sluice.Option
				if global {
					opts = append(opts, sluice.WithEnvoyQuotaMode())
				}
				lim, err := sluice.New(st, testutil.Snapshot(t, "rules: []\n").WithEnvoy(cfg, "v1"), opts...)
				if err != nil {
					t.Fatal(err)
				}
				defer lim.Close()
				for i, s := range steps {
					var d sluice.DescriptorDecision
					if err := lim.CheckDescriptors(context.Background(), &sluice.DescriptorRequest{Domain: "ai", Descriptors: s.descs}, &d); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					want := s.base
					if global {
						want = s.quota
					}
					if d.OK != want {
						t.Errorf("step %d: ok=%v, want %v (statuses %+v)", i, d.OK, want, d.Statuses)
					}
				}
			})
		}
	}
}
