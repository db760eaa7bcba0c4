package admincli

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
)

// TestAdminIdentityOverrides: `overrides create --api-key-hash` and `--ip` store overrides of
// those targets, which the list shows in their columns; a bad one exits as bad input (1), naming
// the field.
func TestAdminIdentityOverrides(t *testing.T) {
	e := newAdminEnv(t)
	hash := "#" + strings.Repeat("0f", 16)
	for _, args := range [][]string{
		{"--api-key-hash", hash, "--type", "multiplier", "--value", "0.1"},
		{"--ip", "203.0.113.0/24", "--type", "ban"},
	} {
		r := e.admin(control.RoleWrite, "", append(append([]string{"overrides", "create"}, args...), "--ttl", "1h", "--reason", "abuse")...)
		if r.code != 0 {
			t.Fatalf("create %v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	stored, err := e.store.ListOverrides(t.Context(), control.OverrideFilter{})
	if err != nil || len(stored) != 2 || stored[0].APIKeyHash != hash || stored[1].IP != "203.0.113.0/24" {
		t.Fatalf("the store holds %+v (%v)", stored, err)
	}
	r := e.admin(control.RoleRead, "", "overrides", "list")
	_, rows := parseTable(t, r.stdout)
	if !hasRow(rows, map[string]string{"API_KEY_HASH": hash, "IP": "-", "TYPE": "multiplier"}) ||
		!hasRow(rows, map[string]string{"IP": "203.0.113.0/24", "API_KEY_HASH": "-", "TYPE": "ban"}) {
		t.Errorf("not listed:\n%s", r.stdout)
	}
	for _, c := range []struct {
		args  []string
		field string
	}{
		{[]string{"--api-key-hash", "sk-live-1"}, "api_key_hash"},
		{[]string{"--ip", "10.0.0.1", "--tenant", "acme"}, "ip"},
	} {
		r := e.admin(control.RoleWrite, "", append(append([]string{"overrides", "create"}, c.args...), "--type", "ban", "--ttl", "1h", "--reason", "r")...)
		if r.code != exitGeneral || !strings.Contains(r.stderr, c.field) {
			t.Errorf("create %v: exit %d %q, want %d naming %s", c.args, r.code, r.stderr, exitGeneral, c.field)
		}
	}
}
