package e2e

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestUsageHistoryCountsDecisions (issue 29): a client counts what the binary answered to
// requests that three rules match each; GET /admin/v1/usage/history without rule= returns
// exactly those counts, each request once by its final state, where the rules' rows added
// up would count each request three times. With rule=, it is that rule's own result.
func TestUsageHistoryCountsDecisions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, `
rules:
  - {name: per-user, key: [tenant, user], algorithm: fixed_window, limit: 5, period: 1h, soft: 60}
  - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: per-endpoint, key: [endpoint], algorithm: fixed_window, limit: 12, period: 1h}
`)
	s := start(t, path, filepath.Join(dir, "data"), "SLUICE_ADMIN_TOKEN="+e2eAdminToken, "SLUICE_EVENTS_FLUSH=200ms")

	answered := map[string]int{"allowed": 0, "denied": 0, "soft": 0}
	for _, user := range []string{"u1", "u2", "u3"} {
		for range 6 {
			_, _, m := s.post("/v1/check", fmt.Sprintf(`{"tenant":"acme","user":%q,"endpoint":"/api/items"}`, user))
			switch {
			case m["allowed"] != true:
				answered["denied"]++
			case m["state"] == "soft":
				answered["soft"]++
			default:
				answered["allowed"]++
			}
		}
	}
	// per-endpoint denies from the 13th request; per-user warns from the 3rd and denies the
	// 6th of each user: the answers mix all three states.
	if answered["allowed"] == 0 || answered["soft"] == 0 || answered["denied"] == 0 {
		t.Fatalf("answers %v: want every state", answered)
	}
	from := "&from=" + time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	var got, perTenant map[string]int
	ok := func() bool {
		got = s.usageTotals("tenant=acme" + from)
		perTenant = s.usageTotals("tenant=acme&rule=per-tenant" + from)
		return reflect.DeepEqual(got, answered) && perTenant["allowed"] == 18
	}
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("usage history of acme = %v, per-tenant %v; the client was answered %v (per-tenant allowed 18)", got, perTenant, answered)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
