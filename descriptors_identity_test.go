package sluice_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// identityDomain limits Envoy requests per API key and per client address.
const identityDomain = `
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-key}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-ip}
`

// TestEnvoyIdentityOverrides: overrides by API key hash and by IP (address or CIDR), as the
// abuse detector makes them, shape RLS requests: the limit current_limit shows, or a ban.
func TestEnvoyIdentityOverrides(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock()
	later := c.Now().Add(time.Hour)
	ov := func(id int64, o policy.Override) policy.StateOverride {
		o.Source, o.ExpiresAt = policy.SourceAutomatic, later
		return policy.StateOverride{ID: id, Override: o}
	}
	st := &policy.State{Version: 1, Overrides: []policy.StateOverride{
		ov(1, policy.Override{APIKeyHash: key.HashedAPIKey("sk-noisy"), Type: policy.OverrideMultiplier, Value: 0.1}),
		ov(2, policy.Override{IP: "198.51.100.7", Type: policy.OverrideMultiplier, Value: 0.1}),
		ov(3, policy.Override{IP: "203.0.113.0/24", Type: policy.OverrideBan, Reason: "abuse"}),
	}}
	files, err := policy.ParseFiles(map[string][]byte{"edge.yaml": []byte(identityDomain)})
	if err != nil {
		t.Fatal(err)
	}
	snap, skipped := policy.CompileWith(files, st, c.Now())
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), snap, sluice.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cases := []struct {
		name   string
		desc   sluice.Descriptor
		limit  uint32
		banned bool
	}{
		{"the key of the hash", entries("api_key", "sk-noisy"), 1, false},
		{"another key", entries("api_key", "sk-calm"), 10, false},
		{"the address", entries("remote_address", "198.51.100.7"), 1, false},
		{"another address", entries("remote_address", "198.51.100.8"), 10, false},
		{"an address in the banned CIDR", entries("remote_address", "203.0.113.9"), 10, true},
	}
	for _, tc := range cases {
		d := rlsCheck(t, l, 1, tc.desc)
		if d.Banned != tc.banned || d.Statuses[0].RequestsPerUnit != tc.limit {
			t.Errorf("%s: banned %v, current_limit %d; want banned %v, %d", tc.name, d.Banned, d.Statuses[0].RequestsPerUnit, tc.banned, tc.limit)
		}
	}
}
