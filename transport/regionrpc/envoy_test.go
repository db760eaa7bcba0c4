package regionrpc

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// envoyRegionsDomain has a global limit per user and a limit of one home region per user.
const envoyRegionsDomain = `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 100, regions: global}
  - key: shared
    rate_limit: {unit: year, requests_per_unit: 10, regions: "home:a"}
`

// rls decides one descriptor key=value of domain edge at n, with hits (0: a look).
func rls(t *testing.T, n *node, hits uint64, k, v string) *sluice.DescriptorDecision {
	t.Helper()
	var d sluice.DescriptorDecision
	r := sluice.DescriptorRequest{Domain: "edge", Descriptors: []sluice.Descriptor{{
		Entries: []envoyconf.Entry{{Key: k, Value: v}}, HitsAddend: hits, HasHitsAddend: true,
	}}}
	if err := n.lim.CheckDescriptors(context.Background(), &r, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// TestEnvoyGlobalLimit: an Envoy-format limit with regions: global is one limit across
// regions, as a native rule's: what one region admits over RLS reaches the other, which then
// admits only what is left.
func TestEnvoyGlobalLimit(t *testing.T) {
	t.Parallel()
	nodes, _ := startRegions(t, envoyRegionsDomain, 50*time.Millisecond, time.Second, "a", "b")
	a, b := nodes["a"], nodes["b"]
	for range 60 {
		if d := rls(t, a, 1, "user", "ann"); !d.OK {
			t.Fatal("a denied below the limit")
		}
	}
	// A look at b reports the limit less a's count once a's reservation has faded. Bounds of
	// 15 s: on a loaded machine syncs run late.
	waitFor(t, 15*time.Second, "b learns a's 60", func() bool { return rls(t, b, 0, "user", "ann").Statuses[0].Remaining == 40 })
	admitted := 0
	for range 100 {
		if rls(t, b, 1, "user", "ann").OK {
			admitted++
		}
	}
	if admitted != 40 {
		t.Fatalf("b admitted %d after a's 60 of 100, want the 40 left", admitted)
	}
	// Another user's limit is untouched.
	if got := rls(t, b, 0, "user", "bob").Statuses[0].Remaining; got != 100 {
		t.Fatalf("another user's global limit has %d left, want 100", got)
	}
}

// TestEnvoyHomeLimit: an Envoy-format limit with regions: home:NAME is decided in that region
// for every region: across both, exactly its limit is admitted.
func TestEnvoyHomeLimit(t *testing.T) {
	t.Parallel()
	nodes, _ := startRegions(t, envoyRegionsDomain, 50*time.Millisecond, 30*time.Second, "a", "b")
	// b reaches its home first (a look): a forward that fails is decided by on_store_error.
	deadline := time.Now().Add(30 * time.Second)
	for rls(t, nodes["b"], 0, "shared", "s").Degraded {
		if time.Now().After(deadline) {
			t.Fatal("b could not reach its home region a within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	admitted := 0
	for range 10 {
		for _, n := range []string{"a", "b"} {
			if rls(t, nodes[n], 1, "shared", "s").OK {
				admitted++
			}
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d across regions, want exactly the home's 10", admitted)
	}
}
