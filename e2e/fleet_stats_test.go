package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/pgtest"
	"github.com/sluicehq/sluice/telemetry/fleetstats"
)

// statsPolicy has one rule every check matches, with a limit no test reaches, so that each
// check counts exactly once in the rule's totals; a second rule, smaller, denies some.
const statsPolicy = `
rules:
  - {name: per-user, key: [tenant, user], algorithm: sliding_window_log, limit: 1000, period: 1h}
  - {name: tight, key: [tenant, user], algorithm: sliding_window_log, limit: 10, period: 1h}
`

// TestFleetStatsAndTop runs two nodes on one PostgreSQL control store, sends traffic to both,
// and reads the fleet's statistics from one: both nodes listed, each rule's totals the sum of
// both nodes' decisions (the other node's carried by its heartbeat through the control store),
// and the heaviest caller first in the top list.
func TestFleetStatsAndTop(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	env := []string{"SLUICE_CONTROL=" + pg.CreateDB(t), "SLUICE_ADMIN_TOKEN=" + e2eAdminToken}
	dir := t.TempDir()
	config := filepath.Join(dir, "policy.yaml")
	writeFile(t, config, statsPolicy)
	a := start(t, config, t.TempDir(), env...)
	b := start(t, config, t.TempDir(), env...)

	// Per node and caller, how many checks; heavy is the heaviest on both nodes together but
	// not on b alone, so the top list is right only when both nodes' sketches are merged.
	traffic := []struct {
		node  *server
		user  string
		count int
	}{
		{a, "heavy", 30},
		{a, "light", 4},
		{b, "heavy", 12},
		{b, "medium", 25},
	}
	perUser := map[string]int{}
	total := 0
	for _, tc := range traffic {
		for range tc.count {
			if code := tc.node.checkStatus(fmt.Sprintf(`{"tenant":"acme","user":%q}`, tc.user)); code != 200 && code != 429 {
				t.Fatalf("check %s: %d", tc.user, code)
			}
		}
		perUser[tc.user] += tc.count
		total += tc.count
	}
	// tight admits 10 per caller and node: heavy 10 on a and 10 on b, light 4, medium 10.
	const tightAllowed = 10 + 4 + 10 + 10

	var fleet fleetstats.Fleet
	var last string
	deadline := time.Now().Add(20 * time.Second) // heartbeats every 3 s; events every second
	for {
		code, body := a.adminRaw("GET", "/admin/v1/stats")
		if code != 200 {
			t.Fatalf("GET stats: %d %s", code, body)
		}
		last = body
		fleet = fleetstats.Fleet{}
		if err := json.Unmarshal([]byte(body), &fleet); err != nil {
			t.Fatalf("stats %q: %v", body, err)
		}
		if len(fleet.Nodes) == 2 && ruleTotal(fleet, "per-user") == int64(total) && ruleTotal(fleet, "tight") == int64(total) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never showed both nodes and %d decisions per rule; last:\n%s", total, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, r := range fleet.Rules {
		if r.Rule == "tight" && r.Total.Allowed != tightAllowed {
			t.Errorf("tight allowed %d over the fleet, want %d (10 per caller and node): %+v", r.Total.Allowed, tightAllowed, r)
		}
		if r.Rule == "per-user" && r.Total.Denied != 0 {
			t.Errorf("per-user denied %d, want 0", r.Total.Denied)
		}
	}
	for _, n := range fleet.Nodes {
		if n.Store != "memory" || !n.StoreUp {
			t.Errorf("node %s: store %q up=%v, want memory up", n.Node, n.Store, n.StoreUp)
		}
	}
	t.Logf("fleet stats: %s", last)

	// The top list, from either node: heavy (42 over the fleet) first, then medium, then light.
	// Each node's sketch reaches the other by its heartbeat, which may come after the one
	// that carried the totals above: each node has until the deadline to show it.
	for _, s := range []*server{a, b} {
		var problems []string
		for {
			problems = topProblems(t, s, perUser)
			if len(problems) == 0 || time.Now().After(deadline.Add(10*time.Second)) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
}

// topProblems reads the top consumers of per-user from s and says what is wrong with them:
// each counted within its error of perUser, of tenant acme, heavy, medium and light in order.
func topProblems(t *testing.T, s *server, perUser map[string]int) []string {
	t.Helper()
	code, body := s.adminRaw("GET", "/admin/v1/top?rule=per-user&limit=3")
	if code != 200 {
		t.Fatalf("GET top: %d %s", code, body)
	}
	var top struct {
		Rules []fleetstats.TopRule `json:"rules"`
	}
	if err := json.Unmarshal([]byte(body), &top); err != nil {
		t.Fatalf("top %q: %v", body, err)
	}
	if len(top.Rules) != 1 || top.Rules[0].Rule != "per-user" {
		return []string{"top of per-user: " + body}
	}
	var problems, got []string
	for _, c := range top.Rules[0].Consumers {
		got = append(got, c.Consumer)
		if want := perUser[c.Consumer[len("user:"):]]; c.Count < int64(want) || c.Count-c.Error > int64(want) {
			problems = append(problems, fmt.Sprintf("%s counted %d ± %d, want %d within", c.Consumer, c.Count, c.Error, want))
		}
		if c.Tenant != "acme" {
			problems = append(problems, fmt.Sprintf("%s tenant %q", c.Consumer, c.Tenant))
		}
	}
	if fmt.Sprint(got) != "[user:heavy user:medium user:light]" {
		problems = append(problems, fmt.Sprintf("top of per-user from %s = %v, want heavy, medium, light", s.http, got))
	}
	return problems
}

// ruleTotal is the fleet's decisions of rule, every outcome.
func ruleTotal(f fleetstats.Fleet, rule string) int64 {
	for _, r := range f.Rules {
		if r.Rule == rule {
			return r.Total.Allowed + r.Total.Soft + r.Total.Denied
		}
	}
	return 0
}

// adminRaw calls the admin API of s with the bootstrap token and returns the answer's body.
func (s *server) adminRaw(method, path string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, "http://"+s.http+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, string(raw)
}
