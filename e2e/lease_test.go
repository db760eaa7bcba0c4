package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

const leasePolicy = `
rules:
  - {name: tokens, match: {endpoint: /llm}, key: [tenant, user], algorithm: token_bucket, limit: 1000, period: 1h}
  - {name: jobs, match: {endpoint: /jobs}, key: [tenant, user], algorithm: sliding_window_log, limit: 10, period: 1h}
  - {name: global, key: [], algorithm: fixed_window, limit: 100000, period: 1h}
`

// TestReservationsAcrossNodes: two sluice processes share a Redis; a lease reserved on one is
// settled on the other, which gives back what was not used, answers a repeat as the first,
// and refuses another tenant's commit with 404, nothing changed.
func TestReservationsAcrossNodes(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, leasePolicy)
	env := []string{"SLUICE_STORE=redis://" + redis.Addr}
	a, b := start(t, path, filepath.Join(dir, "a"), env...), start(t, path, filepath.Join(dir, "b"), env...)
	left := func(s *server, endpoint, rule string) float64 {
		t.Helper()
		_, _, m := s.post("/v1/quota", `{"tenant":"acme","user":"ann","endpoint":"`+endpoint+`"}`)
		for _, r := range m["results"].([]any) {
			if r := r.(map[string]any); r["rule"] == rule {
				return r["remaining"].(float64)
			}
		}
		t.Fatalf("no %s in %v", rule, m)
		return 0
	}
	for _, c := range []struct {
		endpoint, rule   string
		reserve, used    int
		before, reserved float64
	}{
		{"/llm", "tokens", 800, 120, 1000, 200},
		{"/jobs", "jobs", 6, 2, 10, 4},
	} {
		code, _, m := a.post("/v1/reserve", fmt.Sprintf(`{"tenant":"acme","user":"ann","endpoint":%q,"cost":%d,"ttl":"10m"}`, c.endpoint, c.reserve))
		lease, _ := m["lease"].(string)
		if code != 200 || !strings.HasPrefix(lease, "ls_") {
			t.Fatalf("%s: reserve on a: %d %v", c.rule, code, m)
		}
		if got := left(b, c.endpoint, c.rule); got != c.reserved {
			t.Fatalf("%s: node b sees %v left after a's reservation, want %v", c.rule, got, c.reserved)
		}
		if code, _, m := b.post("/v1/commit", `{"tenant":"other","lease":"`+lease+`","used":0}`); code != 404 || m["field"] != "lease" {
			t.Fatalf("%s: another tenant's commit: %d %v", c.rule, code, m)
		}
		code, _, m = b.post("/v1/commit", fmt.Sprintf(`{"tenant":"acme","lease":%q,"used":%d}`, lease, c.used))
		if code != 200 || m["repeated"] != false || m["used"] != float64(c.used) {
			t.Fatalf("%s: commit on b: %d %v", c.rule, code, m)
		}
		want := c.before - float64(c.used)
		if got := left(a, c.endpoint, c.rule); got != want {
			t.Fatalf("%s: reserved %d, used %d: node a sees %v left, want %v", c.rule, c.reserve, c.used, got, want)
		}
		code, _, m = a.post("/v1/release", `{"tenant":"acme","lease":"`+lease+`"}`)
		if code != 200 || m["repeated"] != true || m["used"] != float64(c.used) || left(b, c.endpoint, c.rule) != want {
			t.Fatalf("%s: release after commit: %d %v", c.rule, code, m)
		}
	}
	if m := b.get("/metrics"); !strings.Contains(m, `sluice_leases_total{event="settled"} 2`) || !strings.Contains(m, `sluice_lease_units_total{direction="returned"} 684`) {
		t.Fatalf("node b's lease metrics:\n%s", grepLines(m, "lease"))
	}
}
