package sqlite_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
)

// TestUpgradeToIdentityOverrides opens a database written at schema 9: migration 10 rebuilds
// the overrides table with the ip and api_key_hash columns, keeping every row, id, index and
// the AUTOINCREMENT sequence; an old override keeps its target key, so that a new one of the
// same target still conflicts with it.
func TestUpgradeToIdentityOverrides(t *testing.T) {
	var schema []string
	for _, m := range []string{"control", "events", "escalation", "node_stats", "domains", "change_index", "token_expiry", "revoked_tokens", "decision_minutes"} {
		schema = append(schema, "000"+string(rune('1'+len(schema)))+"_"+m)
	}
	path, db, exec := openAtSchema(t, schema...)
	for i, tenant := range []string{"acme", "globex"} {
		k, _ := json.Marshal([]string{tenant, "", "", "", ""})
		sum := sha256.Sum256(k)
		exec(`INSERT INTO overrides (target_key, tenant, type, value, expires_at, reason, source, created_by, created_at, version)
			VALUES (?1, ?2, 'multiplier', 0.5, 4102444800000000, 'noisy', 'api', 'alice', 1, ?3)`, hex.EncodeToString(sum[:]), tenant, i+1)
	}
	exec("DELETE FROM overrides WHERE tenant = 'globex'")
	exec("UPDATE control_version SET version = 2")
	db.Close()

	s := open(t, path, control.Options{})
	ctx := t.Context()
	got, err := s.ListOverrides(ctx, control.OverrideFilter{})
	if err != nil || len(got) != 1 || got[0].ID != 1 || got[0].Tenant != "acme" || got[0].IP != "" || got[0].APIKeyHash != "" {
		t.Fatalf("overrides after the upgrade = %+v, %v", got, err)
	}
	again := control.Override{Tenant: "acme", Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour), Reason: "r", Source: control.SourceAPI}
	if _, err := s.CreateOverride(ctx, control.Change{Actor: "alice"}, again); !errors.Is(err, control.ErrConflict) {
		t.Errorf("an override of acme after the upgrade: %v, want a conflict with the old one", err)
	}
	byIP := control.Override{IP: "192.0.2.1", Type: control.OverrideBan, ExpiresAt: time.Now().Add(time.Hour), Reason: "r", Source: control.SourceAutomatic}
	if o, err := s.CreateOverride(ctx, control.Change{Actor: control.ActorAbuseDetector}, byIP); err != nil || o.ID != 3 {
		t.Errorf("an ip override after the upgrade: id %d, %v; want id 3 (2 was deleted before)", o.ID, err)
	}
	var indexes []string
	rows, err := raw(t, path).Query("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' AND tbl_name = 'overrides' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		rows.Scan(&n)
		indexes = append(indexes, n)
	}
	if want := "overrides_expires_at overrides_version"; strings.Join(indexes, " ") != want {
		t.Errorf("indexes = %v, want %s", indexes, want)
	}
}
