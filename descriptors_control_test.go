package sluice_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/policy/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
)

// envoyControlDomain limits a tenant, a user, and a tier; the tier entry picks the limit.
const envoyControlDomain = `
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 4, name: per-tenant}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tier
    value: free
    rate_limit: {unit: minute, requests_per_unit: 1, name: free-tier}
  - key: tier
    value: premium
    rate_limit: {unit: minute, requests_per_unit: 50, name: premium-tier}
`

// envoyControlLimiter is a limiter on the clock c whose policy is envoyControlDomain with st.
func envoyControlLimiter(t testing.TB, c *testutil.Clock, st *policy.State, opts ...sluice.Option) *sluice.Limiter {
	t.Helper()
	files, err := policy.ParseFiles(map[string][]byte{"edge.yaml": []byte(envoyControlDomain)})
	if err != nil {
		t.Fatal(err)
	}
	snap, skipped := policy.CompileWith(files, st, c.Now())
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	ms := memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0))
	l, err := sluice.New(ms, snap, append([]sluice.Option{sluice.WithClock(c.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// entries builds a descriptor of key/value pairs.
func entries(kv ...string) sluice.Descriptor {
	var d sluice.Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, envoyconf.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// rlsCheck sends descs to domain edge with cost hits (0: a look) and returns the decision.
func rlsCheck(t *testing.T, l *sluice.Limiter, hits uint64, descs ...sluice.Descriptor) *sluice.DescriptorDecision {
	t.Helper()
	for i := range descs {
		descs[i].HitsAddend, descs[i].HasHitsAddend = hits, true
	}
	d := new(sluice.DescriptorDecision)
	if err := l.CheckDescriptors(ctx, &sluice.DescriptorRequest{Domain: "edge", Descriptors: descs}, d); err != nil {
		t.Fatal(err)
	}
	return d
}

// remaining looks at the descriptor of tenant's limit (and user's) without counting.
func remaining(t *testing.T, l *sluice.Limiter, descs ...sluice.Descriptor) []uint32 {
	t.Helper()
	d := rlsCheck(t, l, 0, descs...)
	out := make([]uint32, len(d.Statuses))
	for i, st := range d.Statuses {
		out[i] = st.Remaining
	}
	return out
}

// TestEnvoyRequestsUnderControl: the control plane shapes RLS requests as it shapes native
// checks (DESIGN.md, "Envoy requests get the whole product"): a ban denies every limited
// descriptor and counts nothing; an exemption answers OK with no limit and counts nothing; a
// multiplier and a custom override change the limit current_limit shows and enforces, named by
// rate_limit.name or by stat key; an assigned tier replaces the tier entry the client sent.
func TestEnvoyRequestsUnderControl(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	later := c.Now().Add(time.Hour)
	ov := func(id int64, o policy.Override) policy.StateOverride {
		o.Source, o.ExpiresAt = policy.SourceAPI, later
		return policy.StateOverride{ID: id, Override: o}
	}
	st := &policy.State{Version: 1,
		Overrides: []policy.StateOverride{
			ov(1, policy.Override{Tenant: "banned", Type: policy.OverrideBan, Reason: "abuse"}),
			ov(2, policy.Override{Tenant: "double", Rule: "per-tenant", Type: policy.OverrideMultiplier, Value: 2}),
			ov(3, policy.Override{User: "tight", Rule: "edge.user", Type: policy.OverrideCustom, Limit: 1}),
		},
		Exemptions: []policy.StateExemption{{ID: 1, Exemption: policy.Exemption{Tenant: "vip"}}},
		Identities: []policy.Identity{{Kind: policy.IdentityTenant, Value: "cheap", Tier: "free"}},
	}
	l := envoyControlLimiter(t, c, st)

	t.Run("ban", func(t *testing.T) {
		for range 3 {
			d := rlsCheck(t, l, 1, entries("tenant", "banned"), entries("user", "b1"), entries("path", "/"))
			if d.OK || !d.Banned {
				t.Fatalf("banned tenant: OK %v banned %v", d.OK, d.Banned)
			}
			if st := d.Statuses[0]; st.OK || !st.HasLimit || st.Name != "per-tenant" || st.ResetAfter != time.Hour {
				t.Errorf("banned tenant's limit: %+v, want OVER_LIMIT with an hour to reset", st)
			}
			if st := d.Statuses[1]; st.OK {
				t.Errorf("banned tenant's user limit: %+v, want OVER_LIMIT", st)
			}
			if !d.Statuses[2].OK {
				t.Error("a descriptor with no limit is over the limit")
			}
		}
		if got := remaining(t, l, entries("tenant", "other"), entries("user", "b1")); got[1] != 3 {
			t.Errorf("after 3 banned requests the user's limit has %d left, want all 3: a ban counts nothing", got[1])
		}
		// A ban with no limited descriptor still denies.
		if d := rlsCheck(t, l, 1, entries("tenant", "banned"), entries("path", "/")); d.OK {
			t.Error("a banned tenant's request with no other limit was allowed")
		}
	})

	t.Run("exempt", func(t *testing.T) {
		for range 10 {
			d := rlsCheck(t, l, 1, entries("tenant", "vip"), entries("user", "v1"))
			if !d.OK || !d.Exempt || d.Statuses[0].HasLimit || d.Statuses[1].HasLimit {
				t.Fatalf("exempt tenant: %+v", d)
			}
		}
		// The same user under another tenant has counted nothing while exempt.
		if got := remaining(t, l, entries("tenant", "other"), entries("user", "v1")); got[1] != 3 {
			t.Errorf("the exempt requests counted: %d of 3 left", got[1])
		}
	})

	for _, tc := range []struct {
		name, key, value string
		limit            uint32 // the effective limit current_limit shows and the store keeps
	}{
		{"multiplier by name", "tenant", "double", 8},
		{"custom by stat key", "user", "tight", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admitted := 0
			for range 3 * tc.limit {
				d := rlsCheck(t, l, 1, entries(tc.key, tc.value))
				if got := d.Statuses[0].RequestsPerUnit; got != tc.limit {
					t.Fatalf("current_limit %d, want %d", got, tc.limit)
				}
				if d.OK {
					admitted++
				}
			}
			if admitted != int(tc.limit) {
				t.Errorf("admitted %d of %d under a limit of %d", admitted, 3*tc.limit, tc.limit)
			}
		})
	}

	t.Run("assigned tier", func(t *testing.T) {
		admitted := 0
		for range 5 {
			d := rlsCheck(t, l, 1, entries("tenant", "cheap"), entries("tier", "premium"))
			if d.Statuses[1].Name != "free-tier" {
				t.Fatalf("tenant cheap claiming premium matched %q, want free-tier", d.Statuses[1].Name)
			}
			if d.OK {
				admitted++
			}
		}
		if admitted != 1 {
			t.Errorf("admitted %d under the free tier of 1", admitted)
		}
		// Another tenant's claim stands.
		if d := rlsCheck(t, l, 1, entries("tenant", "else"), entries("tier", "premium")); d.Statuses[1].Name != "premium-tier" {
			t.Errorf("an unassigned tenant's tier: %q", d.Statuses[1].Name)
		}
	})

	t.Run("expired", func(t *testing.T) {
		c2 := testutil.NewClock()
		l := envoyControlLimiter(t, c2, st)
		c2.Add(2 * time.Hour)
		if d := rlsCheck(t, l, 1, entries("tenant", "banned")); !d.OK {
			t.Error("an expired ban still denies")
		}
	})
}

// TestEnvoyAttributeMapping: the attributes come from the entries --envoy-attributes names
// (the limiter's option), and a domain's attributes: mapping wins over it.
func TestEnvoyAttributeMapping(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	st := &policy.State{Version: 1, Exemptions: []policy.StateExemption{{ID: 1, Exemption: policy.Exemption{Tenant: "vip"}}}}
	m, err := envoyconf.ParseAttributeMap("tenant=org")
	if err != nil {
		t.Fatal(err)
	}
	l := envoyControlLimiter(t, c, st, sluice.WithEnvoyAttributes(m))
	if d := rlsCheck(t, l, 1, entries("org", "vip"), entries("user", "u")); !d.Exempt || d.Caller().Tenant != "vip" || d.Caller().User != "u" {
		t.Errorf("org=vip under tenant=org: exempt %v caller %+v", d.Exempt, d.Caller())
	}
	if d := rlsCheck(t, l, 1, entries("tenant", "vip")); d.Exempt {
		t.Error("the tenant entry still names the tenant once tenant=org")
	}
	d := rlsCheck(t, l, 1, entries("remote_address", "192.0.2.1"), entries("user", "first"), entries("user", "second"))
	if got := d.Caller(); got.IP != "192.0.2.1" || got.User != "first" {
		t.Errorf("caller %+v: want ip from remote_address and the first user", got)
	}
}

// TestEnvoyControlAllocatesNothing: a request under an override and an assignment decides
// without allocating, as a native check does.
func TestEnvoyControlAllocatesNothing(t *testing.T) {
	c := testutil.NewClock()
	st := &policy.State{Version: 1,
		Overrides:  []policy.StateOverride{{ID: 1, Override: policy.Override{Tenant: "double", Type: policy.OverrideMultiplier, Value: 2, Source: policy.SourceAPI, ExpiresAt: c.Now().Add(time.Hour)}}},
		Identities: []policy.Identity{{Kind: policy.IdentityTenant, Value: "double", Tier: "free"}},
	}
	l := envoyControlLimiter(t, c, st)
	req := &sluice.DescriptorRequest{Domain: "edge", Descriptors: []sluice.Descriptor{entries("tenant", "double"), entries("tier", "premium")}}
	var d sluice.DescriptorDecision
	if n := testing.AllocsPerRun(100, func() { l.CheckDescriptors(ctx, req, &d) }); n != 0 {
		t.Errorf("CheckDescriptors under control allocates %v times", n)
	}
}

// BenchmarkEnvoyUnderControl: an RLS request of three descriptors with no control state, with
// 10,000 overrides and 1,000 exemptions of other tenants in force, and as a tenant one of them
// names (a multiplier): what the control plane costs the Envoy path.
func BenchmarkEnvoyUnderControl(b *testing.B) {
	c := testutil.NewClock()
	big := &policy.State{Version: 1}
	for i := range 10_000 {
		big.Overrides = append(big.Overrides, policy.StateOverride{ID: int64(i + 1), Override: policy.Override{
			Tenant: "t" + strconv.Itoa(i), Type: policy.OverrideMultiplier, Value: 2,
			Source: policy.SourceAPI, ExpiresAt: c.Now().Add(time.Hour)}})
	}
	for i := range 1_000 {
		big.Exemptions = append(big.Exemptions, policy.StateExemption{ID: int64(i + 1), Exemption: policy.Exemption{Tenant: "x" + strconv.Itoa(i)}})
	}
	for _, bc := range []struct {
		name   string
		st     *policy.State
		tenant string
	}{
		{"none", nil, "acme"},
		{"10k-overrides/unmatched", big, "acme"},
		{"10k-overrides/matched", big, "t42"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := envoyControlLimiter(b, c, bc.st)
			req := &sluice.DescriptorRequest{Domain: "edge", Descriptors: []sluice.Descriptor{
				entries("tenant", bc.tenant), entries("user", "ann"), entries("remote_address", "192.0.2.1")}}
			var d sluice.DescriptorDecision
			b.ReportAllocs()
			for b.Loop() {
				if err := l.CheckDescriptors(ctx, req, &d); err != nil {
					b.Fatal(err)
				}
				c.Add(time.Second) // a new window now and then keeps the limits open
			}
		})
	}
}
