package follower_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/stallwatch"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// envoyOK decides one Envoy request on n: whether its overall code is OK, and whether a
// limit applied.
func (n *node) envoyOK(t testing.TB, domain string, entries ...envoyconf.Entry) (ok, limited bool) {
	t.Helper()
	var d sluice.DescriptorDecision
	r := sluice.DescriptorRequest{Domain: domain, Descriptors: []sluice.Descriptor{{Entries: entries}}}
	if err := n.lim.CheckDescriptors(context.Background(), &r, &d); err != nil {
		t.Fatalf("CheckDescriptors(%+v): %v", r, err)
	}
	return d.OK, d.Statuses[0].HasLimit
}

// TestDomainOnTwoNodesOnePostgres (issue 27): an Envoy domain put through node A's store is
// enforced by node B within 1 s, replaced and deleted the same way, and a domain of the policy
// files keeps the files' configuration whatever the store holds under its name.
func TestDomainOnTwoNodesOnePostgres(t *testing.T) {
	url := pgtest.DB(t)
	f, err := policy.ParseFiles(map[string][]byte{
		"policy.yaml": []byte(basePolicy),
		"files.yaml":  []byte("domain: files\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	a := startNode(t, openPG(t, url), "node-a", f)
	b := startNode(t, openPG(t, url), "node-b", f)
	stalls := stallwatch.Start(t)
	ip := envoyconf.Entry{Key: "remote_address", Value: "192.0.2.7"}
	within := func(what string, start time.Time, cond func() bool) {
		t.Helper()
		for !cond() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: not within 10 s (policy %s)", what, b.lim.Policy().Version)
			}
			time.Sleep(200 * time.Microsecond)
		}
		took := time.Since(start)
		t.Logf("%s after %v", what, took)
		if own := took - stalls.During(start, start.Add(took)); own > time.Second {
			t.Errorf("%s took %v (stalls discounted: %v), want within 1 s", what, took, own)
		}
	}

	if ok, limited := b.envoyOK(t, "edge", ip); !ok || limited {
		t.Fatalf("edge before the PUT: ok %v, limited %v; want OK with no limit (an unknown domain)", ok, limited)
	}
	start := time.Now()
	put := func(body string) {
		t.Helper()
		if _, _, err := a.store.PutDomain(t.Context(), control.Change{Actor: "alice"}, "edge", json.RawMessage(body)); err != nil {
			t.Fatal(err)
		}
	}
	put(`{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"hour","requests_per_unit":1}}]}`)
	within("domain put on A enforced by B", start, func() bool { return b.lim.Policy().Envoy().HasDomain("edge") })
	if ok, limited := b.envoyOK(t, "edge", ip); !ok || !limited {
		t.Errorf("B's first request in edge: ok %v, limited %v; want OK under the limit", ok, limited)
	}
	if ok, _ := b.envoyOK(t, "edge", ip); ok {
		t.Error("B allows a second request per hour in edge")
	}

	start = time.Now()
	put(`{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unlimited":true}}]}`)
	within("domain replaced on A enforced by B", start, func() bool {
		m := b.lim.Policy().Envoy().Match("edge", []envoyconf.Entry{ip})
		return m.Limit != nil && m.Limit.Unlimited
	})

	// A domain of the files: the store's configuration under its name is left out.
	if _, _, err := a.store.PutDomain(t.Context(), control.Change{Actor: "alice"}, "files", json.RawMessage(
		`{"domain":"files","descriptors":[{"key":"k","rate_limit":{"unit":"second","requests_per_unit":1}}]}`)); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := a.store.DeleteDomain(t.Context(), control.Change{Actor: "alice"}, "edge"); err != nil {
		t.Fatal(err)
	}
	within("domain deleted on A gone from B", start, func() bool { return !b.lim.Policy().Envoy().HasDomain("edge") })
	if m := b.lim.Policy().Envoy().Match("files", []envoyconf.Entry{{Key: "k", Value: "v"}}); m.Limit == nil || m.Limit.RequestsPerUnit != 100 {
		t.Errorf("files matches %+v on B; want the file's 100 per hour", m.Limit)
	}
}
