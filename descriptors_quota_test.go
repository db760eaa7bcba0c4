package sluice_test

import (
	"context"
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
