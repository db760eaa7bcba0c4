package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/metrics"
)

func TestRequestsWithoutIdentityCounted(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "memory")
	for _, anonymous := range []bool{true, false, true} {
		m.ObserveCheck("http", &sluice.Decision{Allowed: true, Anonymous: anonymous}, 0)
	}
	m.ObserveCheck("grpc", &sluice.Decision{Allowed: true, Anonymous: true}, 0)
	for api, want := range map[string]float64{"http": 2, "grpc": 1} {
		if got := counterValue(t, reg, api); got != want {
			t.Errorf("sluice_requests_without_identity_total{api=%q} = %v, want %v", api, got, want)
		}
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, api string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "sluice_requests_without_identity_total" {
			continue
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "api" && l.GetValue() == api {
					return metric.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestTenantThrottleReplacesTheSet(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	set := metrics.New(reg, "memory").TenantThrottle()
	set(map[string]float64{"a": 0.5, "b": 0.25})
	set(map[string]float64{"b": 0.75})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_tenant_throttle_ratio" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if len(got) != 1 || got["b"] != 0.75 {
		t.Fatalf("sluice_tenant_throttle_ratio = %v, want only b = 0.75 (the last set replaces the earlier)", got)
	}
}
