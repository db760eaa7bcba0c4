package admincli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// TestAdminOverridesPages: "overrides list" follows next until the last page and prints every
// override once; --limit N prints one page with its next, and --after that next the page
// after it. A negative --limit is refused before any call.
func TestAdminOverridesPages(t *testing.T) {
	e := newAdminEnv(t)
	const n = 1001 // one more than the server's default page, with admintest's file override
	for i := range n {
		if _, err := e.store.CreateOverride(t.Context(), control.Change{Actor: "test"}, control.Override{
			Tenant: fmt.Sprintf("t%04d", i), Type: control.OverrideBan, ExpiresAt: e.clock.Now().Add(time.Hour), Source: control.SourceAPI}); err != nil {
			t.Fatal(err)
		}
	}
	type page struct {
		Overrides []struct {
			ID     int64  `json:"id"`
			Tenant string `json:"tenant"`
		} `json:"overrides"`
		Next string `json:"next"`
	}
	read := func(r result) page {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		var p page
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
			t.Fatalf("%v: %s", err, r.stdout)
		}
		return p
	}
	e.mu.Lock()
	e.hits = nil
	e.mu.Unlock()
	all := read(e.admin(control.RoleRead, "", "overrides", "list", "-o", "json"))
	seen := map[int64]bool{}
	for _, o := range all.Overrides {
		seen[o.ID] = true
	}
	e.mu.Lock()
	calls := len(e.hits)
	e.mu.Unlock()
	if len(all.Overrides) != n+1 || len(seen) != n+1 || all.Next != "" || calls != 2 {
		t.Errorf("list: %d overrides (%d distinct), next %q, in %d calls; want %d, none, 2", len(all.Overrides), len(seen), all.Next, calls, n+1)
	}

	p1 := read(e.admin(control.RoleRead, "", "overrides", "list", "--limit", "2", "-o", "json"))
	if len(p1.Overrides) != 2 || p1.Next == "" {
		t.Fatalf("--limit 2: %+v", p1)
	}
	p2 := read(e.admin(control.RoleRead, "", "overrides", "list", "--limit", "2", "--after", p1.Next, "-o", "json"))
	if len(p2.Overrides) != 2 || p2.Overrides[0].ID != all.Overrides[2].ID || p2.Overrides[1].ID != all.Overrides[3].ID {
		t.Errorf("--limit 2 --after next: %+v, want the 3rd and 4th of %v", p2, all.Overrides[:4])
	}
	if r := e.admin(control.RoleRead, "", "overrides", "list", "--limit", "-1"); r.code == 0 || !strings.Contains(r.stderr, "--limit") {
		t.Errorf("--limit -1: exit %d, %q", r.code, r.stderr)
	}
	if r := e.admin(control.RoleRead, "", "overrides", "list", "--limit", "2", "--after", "bogus"); r.code == 0 || !strings.Contains(r.stderr, "after") {
		t.Errorf("--after bogus: exit %d, %q", r.code, r.stderr)
	}
}

// TestAdminListsPage: every list command pages as "overrides list" does: --limit 1 prints one
// item and its next, --after that next the item after it, and without --limit every item.
func TestAdminListsPage(t *testing.T) {
	e := newAdminEnv(t)
	ch := control.Change{Actor: "test"}
	for i := range 3 {
		n := fmt.Sprintf("p%d", i)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		_, err := e.store.CreateExemption(t.Context(), ch, control.Exemption{User: n, Reason: "r"})
		must(err)
		_, _, err = e.store.PutIdentity(t.Context(), ch, control.Identity{Kind: control.IdentityUser, Value: n, Tier: "gold"})
		must(err)
		_, err = e.store.CreateRule(t.Context(), ch, n, json.RawMessage(`{"limit":1,"period":"1s"}`))
		must(err)
		_, err = e.store.CreateToken(t.Context(), ch, control.Token{Name: n, Role: control.RoleRead, Hash: control.HashToken("pages-secret-" + n)})
		must(err)
		_, _, err = e.store.PutDomain(t.Context(), ch, n, json.RawMessage(`{"descriptors":[{"key":"remote_address","rate_limit":{"unit":"second","requests_per_unit":10}}]}`))
		must(err)
	}
	for _, key := range []string{"exemptions", "identities", "rules", "tokens", "domains"} {
		t.Run(key, func(t *testing.T) {
			read := func(args ...string) ([]json.RawMessage, string) {
				t.Helper()
				r := e.admin(control.RoleAdmin, "", append([]string{key, "list", "-o", "json"}, args...)...)
				if r.code != 0 {
					t.Fatalf("%s list %v: exit %d: %s", key, args, r.code, r.stderr)
				}
				var body map[string]json.RawMessage
				var items []json.RawMessage
				var next string
				if err := json.Unmarshal([]byte(r.stdout), &body); err != nil || json.Unmarshal(body[key], &items) != nil {
					t.Fatalf("%s list %v: %v: %s", key, args, err, r.stdout)
				}
				if body["next"] != nil {
					if err := json.Unmarshal(body["next"], &next); err != nil {
						t.Fatal(err)
					}
				}
				return items, next
			}
			all, next := read()
			if len(all) < 3 || next != "" {
				t.Fatalf("every page: %d items, next %q", len(all), next)
			}
			p1, next := read("--limit", "1")
			if len(p1) != 1 || next == "" || string(p1[0]) != string(all[0]) {
				t.Fatalf("--limit 1: %s next %q, want %s", p1, next, all[0])
			}
			p2, _ := read("--limit", "1", "--after", next)
			if len(p2) != 1 || string(p2[0]) != string(all[1]) {
				t.Errorf("--after next: %s, want %s", p2, all[1])
			}
			if r := e.admin(control.RoleAdmin, "", key, "list", "--limit", "1", "--after", "bogus"); r.code == 0 || !strings.Contains(r.stderr, "after") {
				t.Errorf("--after bogus: exit %d, %q", r.code, r.stderr)
			}
		})
	}
}

// TestAdminViolationsAfter: "violations --limit 1" prints one minute count and its next;
// --after that next prints the count after it, older.
func TestAdminViolationsAfter(t *testing.T) {
	e := newAdminEnv(t)
	m0 := e.clock.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	if err := e.store.AddCounts(t.Context(), nil, []control.ViolationCount{
		{Minute: m0, Rule: "r", User: "old", Denied: 1, Limit: 1},
		{Minute: m0.Add(time.Minute), Rule: "r", User: "new", Denied: 1, Limit: 1},
	}); err != nil {
		t.Fatal(err)
	}
	type page struct {
		Violations []struct{ User string } `json:"violations"`
		Next       string                  `json:"next"`
	}
	read := func(args ...string) page {
		t.Helper()
		r := e.admin(control.RoleRead, "", append([]string{"violations", "--limit", "1", "-o", "json"}, args...)...)
		var p page
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil {
			t.Fatalf("violations %v: exit %d: %s %s", args, r.code, r.stdout, r.stderr)
		}
		return p
	}
	p1 := read()
	if len(p1.Violations) != 1 || p1.Violations[0].User != "new" || p1.Next == "" {
		t.Fatalf("first page: %+v", p1)
	}
	if p2 := read("--after", p1.Next); len(p2.Violations) != 1 || p2.Violations[0].User != "old" || p2.Next != "" {
		t.Errorf("--after next: %+v, want old and no next", p2)
	}
}
