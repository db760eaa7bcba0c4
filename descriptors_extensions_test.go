package sluice_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/testutil"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// envoyExtensionsDomain has an adaptive window, an adaptive bucket, a plain limit and a limit
// with an escalation, in domain edge (rlsCheck's).
const envoyExtensionsDomain = `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, adaptive: trust}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 20, adaptive: trust}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: burst
    rate_limit:
      unit: minute
      requests_per_unit: 1000
      escalation: {window: 10s, threshold: 5, penalty: 5m}
`

// extensionsLimiter is a limiter over envoyExtensionsDomain and st on the clock c.
func extensionsLimiter(t *testing.T, c *testutil.Clock, st *policy.State, opts ...sluice.Option) *sluice.Limiter {
	t.Helper()
	files, err := policy.ParseFiles(map[string][]byte{"edge.yaml": []byte(envoyExtensionsDomain)})
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

// TestEnvoyAdaptiveLimits: adaptive: trust inside a rate_limit scales the limit by the
// caller's trust score as for a native rule (rate × (1 + t/2), burst × (1 + t)), enforced and
// shown in current_limit; callers without a score, and limits without adaptive, keep theirs.
func TestEnvoyAdaptiveLimits(t *testing.T) {
	t.Parallel()
	trust := func(v float64) *float64 { return &v }
	st := &policy.State{Version: 1, Identities: []policy.Identity{
		{Kind: policy.IdentityUser, Value: "full", Trust: trust(1)},
		{Kind: policy.IdentityUser, Value: "half", Trust: trust(0.5)},
		{Kind: policy.IdentityAPIKey, Value: "k-full", Trust: trust(1)},
	}}
	tests := []struct {
		name     string
		descs    []sluice.Descriptor
		shown    uint32 // current_limit.requests_per_unit
		admitted int    // of 300 requests at one instant
	}{
		{"window, no score", []sluice.Descriptor{entries("user", "nobody")}, 100, 100},
		{"window, t=0.5", []sluice.Descriptor{entries("user", "half")}, 125, 125},
		{"window, t=1", []sluice.Descriptor{entries("user", "full")}, 150, 150},
		{"bucket, t=1: burst 20 × 2", []sluice.Descriptor{entries("api_key", "k-full")}, 90, 40},
		{"bucket, no score", []sluice.Descriptor{entries("api_key", "k-none")}, 60, 20},
		{"a plain limit beside a trusted user", []sluice.Descriptor{entries("plain", "p"), entries("user", "full")}, 10, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := extensionsLimiter(t, testutil.NewClock(), st)
			admitted := 0
			for range 300 {
				d := rlsCheck(t, l, 1, tc.descs...)
				if got := d.Statuses[0].RequestsPerUnit; got != tc.shown {
					t.Fatalf("current_limit %d, want %d", got, tc.shown)
				}
				if d.OK {
					admitted++
				}
			}
			if admitted != tc.admitted {
				t.Errorf("admitted %d of 300, want %d", admitted, tc.admitted)
			}
		})
	}
}

// burstLog collects what the burst hook reports.
type burstLog struct {
	mu  sync.Mutex
	got []sluice.Burst
}

func (b *burstLog) add(x sluice.Burst) { b.mu.Lock(); b.got = append(b.got, x); b.mu.Unlock() }

func (b *burstLog) all() []sluice.Burst {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]sluice.Burst(nil), b.got...)
}

// TestEnvoyEscalation: a limit's escalation counts each caller's RLS requests (its API key,
// else its user), reports the one request of a window that crosses the threshold to the burst
// hook, naming the limit by its stat key, and changes no decision; a caller escalation cannot
// name, and looks, count nothing. A ban on that stat key, which escalation writes, denies the
// caller at that limit only.
func TestEnvoyEscalation(t *testing.T) {
	t.Parallel()
	const rule = "edge.burst"
	want := func(b sluice.Burst) sluice.Burst {
		b.Rule, b.Window, b.Threshold, b.Penalty = rule, 10*time.Second, 5, 5*time.Minute
		return b
	}
	tests := []struct {
		name  string
		descs []sluice.Descriptor
		hits  uint64
		want  []sluice.Burst
	}{
		{"user", []sluice.Descriptor{entries("burst", "x"), entries("tenant", "t1"), entries("user", "u1")}, 1,
			[]sluice.Burst{want(sluice.Burst{Tenant: "t1", User: "u1"})}},
		{"api key before user", []sluice.Descriptor{entries("burst", "x"), entries("user", "u1"), entries("api_key", "k1")}, 1,
			[]sluice.Burst{want(sluice.Burst{APIKey: "k1"})}},
		{"two descriptors of one limit count once", []sluice.Descriptor{entries("burst", "x"), entries("burst", "y"), entries("user", "u2")}, 1,
			[]sluice.Burst{want(sluice.Burst{User: "u2"})}},
		{"an address alone is not named", []sluice.Descriptor{entries("burst", "x"), entries("remote_address", "10.0.0.1")}, 1, nil},
		{"looks count nothing", []sluice.Descriptor{entries("burst", "x"), entries("user", "u1")}, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log burstLog
			l := extensionsLimiter(t, testutil.NewClock(), &policy.State{Version: 1}, sluice.WithBurstHook(log.add))
			for i := range 12 {
				d := rlsCheck(t, l, tc.hits, tc.descs...)
				if !d.OK {
					t.Fatalf("request %d denied: escalation changes no decision", i+1)
				}
				if i == 5 && len(tc.want) > 0 && len(log.all()) != 1 {
					t.Fatalf("after the 6th request (threshold 5): %d bursts, want 1", len(log.all()))
				}
			}
			got := log.all()
			if len(got) != len(tc.want) {
				t.Fatalf("bursts %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("burst %+v, want %+v", got[i], tc.want[i])
				}
			}
		})
	}

	t.Run("ban on the stat key", func(t *testing.T) {
		t.Parallel()
		c := testutil.NewClock()
		st := &policy.State{Version: 1, Overrides: []policy.StateOverride{{ID: 1, Override: policy.Override{
			User: "u1", Rule: rule, Type: policy.OverrideBan, Reason: "burst", Source: policy.SourceAutomatic, ExpiresAt: c.Now().Add(5 * time.Minute),
		}}}}
		l := extensionsLimiter(t, c, st)
		if d := rlsCheck(t, l, 1, entries("burst", "x"), entries("user", "u1")); d.OK || !d.Banned || d.Statuses[0].ResetAfter != 5*time.Minute {
			t.Errorf("banned user: OK %v banned %v %+v", d.OK, d.Banned, d.Statuses[0])
		}
		if d := rlsCheck(t, l, 1, entries("plain", "p"), entries("user", "u1")); !d.Statuses[0].OK {
			t.Error("the ban on one limit denied another")
		}
		if d := rlsCheck(t, l, 1, entries("burst", "x"), entries("user", "u2")); !d.OK {
			t.Error("another user was denied")
		}
	})
}

// TestEnvoyExtensionsAllocateNothing: an RLS request with an adaptive limit of a trusted
// caller and a limit with an escalation (its burst counter) allocates nothing once its
// decision's buffers are warm.
func TestEnvoyExtensionsAllocateNothing(t *testing.T) {
	trust := 1.0
	st := &policy.State{Version: 1, Identities: []policy.Identity{{Kind: policy.IdentityUser, Value: "full", Trust: &trust}}}
	var log burstLog
	l := extensionsLimiter(t, testutil.NewClock(), st, sluice.WithBurstHook(log.add))
	r := sluice.DescriptorRequest{Domain: "edge", Descriptors: []sluice.Descriptor{entries("user", "full"), entries("burst", "x")}}
	var d sluice.DescriptorDecision
	if n := testing.AllocsPerRun(100, func() {
		if err := l.CheckDescriptors(ctx, &r, &d); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per request, want 0", n)
	}
	if d.Statuses[0].RequestsPerUnit != 150 || len(log.all()) == 0 {
		t.Errorf("current_limit %d, bursts %d: the request took neither path", d.Statuses[0].RequestsPerUnit, len(log.all()))
	}
}

// TestEnvoyEscalationCountsOnceUnderQuotaMode: a request whose quota_mode limits are some but
// not all over is applied twice (applyDescriptorOps); its burst counter counts it once, so the
// burst is the 6th request of threshold 5, not the 3rd.
func TestEnvoyEscalationCountsOnceUnderQuotaMode(t *testing.T) {
	t.Parallel()
	files, err := policy.ParseFiles(map[string][]byte{"edge.yaml": []byte(`
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000, escalation: {window: 1h, threshold: 5, penalty: 5m}}
  - key: spent
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: roomy
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.NewClock()
	snap, skipped := policy.CompileWith(files, &policy.State{Version: 1}, c.Now())
	if len(skipped) > 0 {
		t.Fatal(skipped)
	}
	var log burstLog
	l, err := sluice.New(memory.New(memory.WithClock(c.Micros), memory.WithSweepInterval(0)), snap, sluice.WithClock(c.Now), sluice.WithBurstHook(log.add))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 6 {
		d := rlsCheck(t, l, 1, entries("user", "u1"), entries("spent", "s"), entries("roomy", "r"))
		if !d.OK || d.Statuses[1].OK {
			t.Fatalf("request %d: OK %v, spent quota %v; want allowed with one quota over", i+1, d.OK, d.Statuses[1].OK)
		}
		if n := len(log.all()); (i < 5 && n != 0) || (i == 5 && n != 1) {
			t.Fatalf("after request %d: %d bursts; want the burst at the 6th only", i+1, n)
		}
	}
}
