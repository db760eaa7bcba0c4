package usage

import (
	"maps"
	"testing"
)

// The per-tenant throttle ratio behind sluice_tenant_throttle_ratio: every rule together,
// the most throttled tenants only, none for requests without a tenant or tenants never
// throttled.
func TestTenantThrottle(t *testing.T) {
	t.Parallel()
	c := newCounts()
	add := func(rule, tenant string, allowed, denied, soft int64) {
		c.usage[usageKey{minute: 1, rule: rule, tenant: tenant}] = &usageVal{allowed, denied, soft}
	}
	add("a", "noisy", 10, 80, 10) // 90 of 100 on rule a...
	add("b", "noisy", 100, 0, 0)  // ...and 0 of 100 on rule b: 90 of 200
	add("a", "mild", 90, 5, 5)
	add("a", "calm", 100, 0, 0)
	add("a", "", 0, 500, 0)
	add("a", "tiny", 0, 1, 0)
	tests := []struct {
		name string
		top  int
		want map[string]float64
	}{
		{"all throttled tenants", 10, map[string]float64{"noisy": 0.45, "mild": 0.1, "tiny": 1}},
		{"the most throttled first", 2, map[string]float64{"noisy": 0.45, "mild": 0.1}},
		{"none", 0, map[string]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tenantThrottle(c, tt.top); !maps.Equal(got, tt.want) {
				t.Fatalf("tenantThrottle(top %d) = %v, want %v", tt.top, got, tt.want)
			}
		})
	}
}
