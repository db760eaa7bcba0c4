package e2e

import (
	"fmt"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/pgtest"
)

// usageTotals sums the points of GET /admin/v1/usage/history?query.
func (s *server) usageTotals(query string) map[string]int {
	s.t.Helper()
	code, m := s.admin("GET", "/admin/v1/usage/history?"+query, "")
	if code != 200 {
		s.t.Fatalf("usage history %s: %d %v", query, code, m)
	}
	sum := map[string]int{}
	points, _ := m["points"].([]any)
	for _, p := range points {
		for _, k := range []string{"allowed", "denied", "soft"} {
			sum[k] += int(p.(map[string]any)[k].(float64))
		}
	}
	return sum
}

// violationTotals sums GET /admin/v1/violations?query by "user state rule api_key ip endpoint
// limit".
func (s *server) violationTotals(query string) map[string]int {
	s.t.Helper()
	code, m := s.admin("GET", "/admin/v1/violations?"+query, "")
	if code != 200 {
		s.t.Fatalf("violations %s: %d %v", query, code, m)
	}
	sum := map[string]int{}
	vs, _ := m["violations"].([]any)
	for _, v := range vs {
		v := v.(map[string]any)
		k := fmt.Sprintf("%v %v %v %v %v %v %v", v["user"], v["state"], v["rule"], v["api_key"], v["ip"], v["endpoint"], v["limit"])
		sum[k] += int(v["count"].(float64))
	}
	return sum
}

// TestViolationsAndUsageFromTwoNodes: two nodes on one PostgreSQL decide known checks; once
// flushed, GET /admin/v1/usage/history (per minute, hour and day) and /admin/v1/violations on
// either node return exactly what both sent, added up, and keep returning it (nothing is
// written twice). Looks (/v1/quota, cost 0) are not counted, and no API key is stored.
func TestViolationsAndUsageFromTwoNodes(t *testing.T) {
	pg := pgtest.Start(t)
	dbURL := pg.CreateDB(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeFile(t, path, nativePolicy)
	env := []string{"SLUICE_CONTROL=" + dbURL, "SLUICE_ADMIN_TOKEN=" + e2eAdminToken, "SLUICE_EVENTS_FLUSH=200ms"}
	a := start(t, path, filepath.Join(dir, "a"), env...)
	b := start(t, path, filepath.Join(dir, "b"), env...)

	// per-user: limit 5 per hour, soft from 60%. Each node has its own memory store, so on each
	// the 8 checks of a user are 2 normal, 3 soft (the 3rd to the 5th) and 3 denied.
	const apiKey = "sk-live-e2e-secret"
	for _, n := range []*server{a, b} {
		want := []int{200, 200, 200, 200, 200, 429, 429, 429}
		for i, code := range want {
			if got := n.checkStatus(`{"tenant":"acme","user":"u1","api_key":"` + apiKey + `","ip":"192.0.2.7","endpoint":"/api/items"}`); got != code {
				t.Fatalf("check %d: %d, want %d", i+1, got, code)
			}
		}
		// Looks: not decisions.
		n.post("/v1/quota", `{"tenant":"acme","user":"u1"}`)
		n.post("/v1/check", `{"tenant":"acme","user":"u1","cost":0}`)
	}
	if code := b.checkStatus(`{"tenant":"globex","user":"u2"}`); code != 200 {
		t.Fatalf("globex: %d", code)
	}

	wantUsage := map[string]int{"allowed": 4, "soft": 6, "denied": 6}
	keyHash := key.HashedAPIKey(apiKey)
	check := func() bool {
		for _, step := range []string{"1m", "1h", "1d"} {
			q := "rule=per-user&tenant=acme&step=" + step + "&from=" + url.QueryEscape(time.Now().Add(-48*time.Hour).UTC().Format(time.RFC3339))
			for _, n := range []*server{a, b} {
				if got := n.usageTotals(q); !reflect.DeepEqual(got, wantUsage) {
					t.Logf("usage %s on %s: %v", step, n.http, got)
					return false
				}
			}
		}
		got := a.violationTotals("tenant=acme")
		want := map[string]int{
			"u1 hard per-user " + keyHash + " 192.0.2.7 /api/items 5": 6,
			"u1 soft per-user " + keyHash + " 192.0.2.7 /api/items 5": 6,
		}
		if !reflect.DeepEqual(got, want) {
			t.Logf("violations: %v", got)
			return false
		}
		// Filtering by the key itself or by its hashed prefix finds them.
		for _, k := range []string{apiKey, keyHash} {
			if got := b.violationTotals("api_key=" + url.QueryEscape(k)); !reflect.DeepEqual(got, want) {
				t.Logf("violations api_key=%s: %v", k, got)
				return false
			}
		}
		return reflect.DeepEqual(b.usageTotals("tenant=globex"), map[string]int{"allowed": 1, "denied": 0, "soft": 0})
	}
	waitFor(t, 10*time.Second, "counts of both nodes written", check)
	time.Sleep(time.Second) // five more flushes: the counts stay what was sent
	if !check() {
		t.Fatal("counts changed after more flushes")
	}
	for _, n := range []*server{a, b} {
		if m := n.get("/metrics"); !regexp.MustCompile(`(?m)^sluice_events_dropped_total 0$`).MatchString(m) {
			t.Errorf("sluice_events_dropped_total on %s is not 0:\n%s", n.http, grepLines(m, "sluice_events"))
		}
	}
	a.stop()
	b.stop()
}
