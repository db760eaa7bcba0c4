package abuse_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/abuse"
	"github.com/sluicehq/sluice/control/controltest"
	"github.com/sluicehq/sluice/internal/key"
)

// TestDetectorPenalizesAPIKeysAndIPs (issue 27): callers without a tenant or user are
// penalized by the identity the counts name, an API key by its hash and an IP by its
// address, within the cap and worst first; an operator's override of the key (by the key
// itself) covers it, and an operator's ban of a network covers its addresses (a penalty of
// one, the longer prefix, would lift the ban for it); a key the counts do not hold hashed is flagged, never penalized; those
// with too few requests are left alone.
func TestDetectorPenalizesAPIKeysAndIPs(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clock := controltest.NewClock(t0)
			cfg := abuse.DefaultConfig()
			cfg.MaxPenalties = 2
			n := newNode(t, b.db(t, clock), clock, "node-a", cfg)
			ctx := t.Context()
			m := t0.Truncate(time.Minute).Add(-time.Minute)
			hot, worst, covered, calm := key.HashedAPIKey("sk-hot"), key.HashedAPIKey("sk-worst"), key.HashedAPIKey("sk-covered"), key.HashedAPIKey("sk-calm")
			v := func(apiKey, ip string, denied int64) control.ViolationCount {
				return control.ViolationCount{Minute: m, Rule: "r", APIKey: apiKey, IP: ip, Denied: denied}
			}
			// 20 allowed requests without a tenant: a share is denied / (denied + 20).
			feed(t, n.store, []control.UsageCount{{Minute: m, Rule: "r", Allowed: 20}},
				v(hot, "", 200),                // 90.9%
				v(worst, "", 400),              // 95.2%: the worst
				v(covered, "", 400),            // an operator's override names its key
				v(calm, "", 50),                // 71%: medium, never penalized
				v("not-hashed", "", 300),       // flagged; no override can name it
				v("", "::ffff:192.0.2.9", 300), // 93.7%, by its unmapped address
				v("", "192.0.2.10", 10),        // too few
			)
			if _, err := n.store.CreateOverride(ctx, control.Change{Actor: "alice"}, control.Override{
				APIKey: "sk-covered", Type: control.OverrideCustom, Limit: 1000, ExpiresAt: t0.Add(time.Hour), Reason: "a partner", Source: control.SourceAPI,
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := n.store.CreateOverride(ctx, control.Change{Actor: "alice"}, control.Override{
				IP: "203.0.113.0/24", Type: control.OverrideBan, ExpiresAt: t0.Add(time.Hour), Reason: "stuffing", Source: control.SourceAPI,
			}); err != nil {
				t.Fatal(err)
			}
			flags, err := n.det.Detect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := automatic(t, n.store)
			for _, k := range []string{"api_key " + worst, "ip 192.0.2.9"} {
				o, ok := got[k]
				if !ok {
					t.Errorf("no penalty for %s; got %v", k, keys(got))
					continue
				}
				if o.Type != control.OverrideMultiplier || o.Value != cfg.Multiplier || o.Tenant != "" || o.User != "" || o.APIKey != "" ||
					o.CreatedBy != control.ActorAbuseDetector || !o.ExpiresAt.Equal(t0.Add(cfg.Penalty)) {
					t.Errorf("penalty for %s = %+v", k, o)
				}
			}
			if len(got) != 2 {
				t.Errorf("automatic overrides %v, want the cap (2): the worst key and the IP", keys(got))
			}
			status := map[string]string{}
			for _, f := range flags {
				s := f.Severity
				switch {
				case f.Override != nil:
					s = "penalized"
				case f.Skipped:
					s = "skipped"
				}
				status[f.Target.String()] = s
			}
			want := map[string]string{
				"api_key " + worst: "penalized", "ip 192.0.2.9": "penalized", "api_key " + hot: "skipped",
				"api_key not-hashed": abuse.SeverityHigh,
			}
			if len(status) != len(want) {
				t.Errorf("flags %v, want %v", status, want)
			}
			for k, w := range want {
				if status[k] != w {
					t.Errorf("%s: %q, want %q (all: %v)", k, status[k], w, status)
				}
			}

			// The next run penalizes the skipped key; the penalized are covered.
			clock.Advance(time.Minute)
			if _, err := n.det.Detect(ctx); err != nil {
				t.Fatal(err)
			}
			got = automatic(t, n.store)
			if _, ok := got["api_key "+hot]; !ok || len(got) != 3 {
				t.Errorf("after the second run: %v, want the worst key, the IP and then the hot key", keys(got))
			}
		})
	}
}
