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
