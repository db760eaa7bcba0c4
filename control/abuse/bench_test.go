package abuse_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/abuse"
	"github.com/sluicehq/sluice/control/controltest"
)

// BenchmarkDetect times one detector run over a full window: 10,000 tenants with counts in each
// of the 5 minutes of the window under two rules (100,000 rows), 1% of them noisy, and as many
// tenant-less identities with violations. The penalties of the first run cover the noisy
// ones afterwards, so the iterations time the read and the judging, which is what every run pays.
func BenchmarkDetect(b *testing.B) {
	const tenants = 10_000
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			clock := controltest.NewClock(t0)
			st := be.db(b, clock)()
			for m := range 5 {
				var usage []control.UsageCount
				var viols []control.ViolationCount
				minute := t0.Truncate(time.Minute).Add(time.Duration(m-4) * time.Minute)
				for i := range tenants {
					denied := int64(1)
					if i%100 == 0 {
						denied = 90
					}
					tenant := fmt.Sprintf("tenant-%05d", i)
					usage = append(usage,
						control.UsageCount{Minute: minute, Rule: "a", Tenant: tenant, Allowed: 10, Denied: denied},
						control.UsageCount{Minute: minute, Rule: "b", Tenant: tenant, Allowed: 20})
					viols = append(viols, control.ViolationCount{Minute: minute, Rule: "a", IP: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Denied: 1})
				}
				usage = append(usage, control.UsageCount{Minute: minute, Rule: "a", Allowed: 1000, Denied: tenants})
				if err := st.AddCounts(b.Context(), usage, viols); err != nil {
					b.Fatal(err)
				}
			}
			d, err := abuse.New(abuse.Options{Store: st, Holder: "bench", Config: abuse.DefaultConfig(), Now: clock.Now})
			if err != nil {
				b.Fatal(err)
			}
			flags, err := d.Detect(b.Context())
			if err != nil || len(flags) != tenants/100 {
				b.Fatalf("first run: %d flags, %v; want %d", len(flags), err, tenants/100)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := d.Detect(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
