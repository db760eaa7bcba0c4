package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/controltest"
	"github.com/sluicehq/sluice/control/sqlite"
)

func open(t *testing.T, path string, opts control.Options) control.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// raw opens the file with database/sql directly, to look at what the Store wrote.
func raw(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestConformance(t *testing.T) {
	controltest.Run(t, controltest.Harness{
		NewDB: func(t *testing.T) string { return sqlite.Path(filepath.Join(t.TempDir(), "data")) },
		Open:  open,
		Columns: func(t *testing.T, path, table string) []string {
			rows, err := raw(t, path).Query("SELECT name FROM pragma_table_info(?1)", table)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var cols []string
			for rows.Next() {
				var c string
				if err := rows.Scan(&c); err != nil {
					t.Fatal(err)
				}
				cols = append(cols, c)
			}
			return cols
		},
	})
}

func TestFileLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := sqlite.Path(dir)
	if filepath.Base(path) != "control.db" || filepath.Dir(path) != dir {
		t.Fatalf("Path(%s) = %s, want %s/control.db", dir, path, dir)
	}
	open(t, path, control.Options{})
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode = %v, %v; want 0700 (it holds tokens' hashes and the audit log)", st.Mode().Perm(), err)
	}
	db := raw(t, path)
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n != 10 {
		t.Errorf("schema_migrations has %d rows, %v; want 10", n, err)
	}
	for _, table := range []string{"usage_minutes", "violation_minutes", "leases", "domains"} {
		if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
}

// TestOddPaths: the path goes into a file: URI; characters that mean something there must
// still name the file.
func TestOddPaths(t *testing.T) {
	for _, name := range []string{"a?b", "a#b", "a%20b", "a b", "ünï"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), name, "control.db")
			s := open(t, path, control.Options{})
			if _, err := s.Version(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("the store is not at %s: %v", path, err)
			}
		})
	}
}

// TestNewerSchema: a file migrated by a newer Sluice is refused, not written around.
func TestNewerSchema(t *testing.T) {
	path := sqlite.Path(t.TempDir())
	s, err := sqlite.Open(t.Context(), path, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO schema_migrations (version, name) VALUES (9999, 'future')"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = sqlite.Open(context.Background(), path, control.Options{})
	if err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open of a newer schema: %v, want an error saying it is newer", err)
	}
}

// TestUpgradeToEscalation opens a database written at schema 2 (before escalation): migration
// 3 rebuilds the overrides and audit tables to widen their CHECK constraints, keeping every
// row, id, index and AUTOINCREMENT sequence, so that an id deleted before is never reused.
func TestUpgradeToEscalation(t *testing.T) {
	path, db, exec := openAtSchema(t, "0001_control", "0002_events")
	for i, tenant := range []string{"acme", "globex", "initech"} {
		exec(`INSERT INTO overrides (target_key, tenant, type, value, expires_at, reason, source, created_by, created_at, version)
			VALUES (?1, ?2, 'multiplier', 0.5, 4102444800000000, 'noisy', 'api', 'alice', 1, ?3)`, strings.Repeat(string(rune('a'+i)), 64), tenant, i+1)
		exec(`INSERT INTO audit_events (at, actor, action, kind, target, reason, version) VALUES (1, 'alice', 'create', 'override', ?1, '', ?2)`, tenant, i+1)
	}
	exec("DELETE FROM overrides WHERE tenant = 'initech'")
	exec("DELETE FROM audit_events WHERE target = 'initech'")
	db.Close()

	s := open(t, path, control.Options{})
	ctx := t.Context()
	got, err := s.ListOverrides(ctx, control.OverrideFilter{})
	if err != nil || len(got) != 2 || got[0].ID != 1 || got[0].Tenant != "acme" || got[1].ID != 2 || got[1].Value != 0.5 {
		t.Fatalf("overrides after the upgrade = %+v, %v", got, err)
	}
	warn, err := s.CreateOverride(ctx, control.Change{Actor: control.ActorAbuseDetector, Action: control.ActionBurstWarning},
		control.Override{User: "bob", Rule: "search", Type: control.OverrideWarn, ExpiresAt: time.Now().Add(time.Hour), Reason: "burst", Source: control.SourceAutomatic})
	if err != nil || warn.ID != 4 {
		t.Fatalf("a warn override after the upgrade: id %d, %v; want id 4 (3 was deleted before)", warn.ID, err)
	}
	evs, err := s.Audit(ctx, control.AuditFilter{})
	if err != nil || len(evs) != 3 || evs[0].ID != 4 || evs[0].Action != control.ActionBurstWarning || evs[2].Target != "acme" {
		t.Fatalf("audit after the upgrade = %+v, %v; want the warning as event 4 over events 1 and 2", evs, err)
	}
	var indexes []string
	rows, err := raw(t, path).Query("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' AND tbl_name IN ('overrides', 'audit_events') ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		rows.Scan(&n)
		indexes = append(indexes, n)
	}
	if want := "audit_events_actor audit_events_at audit_events_kind audit_events_target audit_events_version overrides_expires_at overrides_version"; strings.Join(indexes, " ") != want {
		t.Errorf("indexes = %v, want %s", indexes, want)
	}
}

// TestUpgradeToNodeStats opens a database written at schema 3: migration 4 adds the nodes'
// stats column, and a node recorded before it reads back with no stats.
func TestUpgradeToNodeStats(t *testing.T) {
	path, db, exec := openAtSchema(t, "0001_control", "0002_events", "0003_escalation")
	now := time.Now()
	exec("INSERT INTO nodes (id, addr, policy_version, seen_at) VALUES ('old', 'a:1', 3, ?1)", now.UnixMicro())
	db.Close()

	s := open(t, path, control.Options{})
	nodes, err := s.Nodes(t.Context(), now.Add(-time.Minute))
	if err != nil || len(nodes) != 1 || nodes[0].ID != "old" || nodes[0].Stats != nil {
		t.Fatalf("nodes after the upgrade = %+v, %v", nodes, err)
	}
	if err := s.Heartbeat(t.Context(), control.Node{ID: "old", Addr: "a:1", PolicyVersion: 3, Stats: []byte(`{}`)}); err != nil {
		t.Fatalf("heartbeat with stats after the upgrade: %v", err)
	}
}

// openAtSchema writes a new database as the given migrations leave it, recorded as applied,
// for the upgrade tests; exec runs a statement on it or fails the test.
func openAtSchema(t *testing.T, migrations ...string) (path string, db *sql.DB, exec func(q string, args ...any)) {
	t.Helper()
	path = sqlite.Path(t.TempDir())
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	exec = func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	queries, err := os.ReadFile("sql/queries/migrations.sql")
	if err != nil {
		t.Fatal(err)
	}
	exec(strings.SplitN(strings.SplitN(string(queries), "-- name: MigrationTableCreate\n", 2)[1], ";", 2)[0])
	for _, m := range migrations {
		ddl, err := os.ReadFile("sql/migrations/" + m + ".sql")
		if err != nil {
			t.Fatal(err)
		}
		exec(string(ddl))
		exec("INSERT INTO schema_migrations (version, name) VALUES (?1, ?2)", m[3:4], m[5:])
	}
	return path, db, exec
}

// TestUpgradeToDomains opens a database written at schema 4: migration 5 adds the domains
// table and rebuilds the audit table to allow kind "domain", keeping its rows, ids, indexes
// and AUTOINCREMENT sequence.
func TestUpgradeToDomains(t *testing.T) {
	path, db, exec := openAtSchema(t, "0001_control", "0002_events", "0003_escalation", "0004_node_stats")
	for i, target := range []string{"a", "b", "c"} {
		exec(`INSERT INTO audit_events (at, actor, action, kind, target, reason, version) VALUES (1, 'alice', 'create', 'rule', ?1, '', ?2)`, target, i+1)
	}
	exec("DELETE FROM audit_events WHERE target = 'c'")
	exec("UPDATE control_version SET version = 3")
	db.Close()

	s := open(t, path, control.Options{})
	ctx := t.Context()
	if _, _, err := s.PutDomain(ctx, control.Change{Actor: "alice"}, "edge", json.RawMessage(`{"domain":"edge"}`)); err != nil {
		t.Fatalf("PutDomain after the upgrade: %v", err)
	}
	evs, err := s.Audit(ctx, control.AuditFilter{})
	if err != nil || len(evs) != 3 || evs[0].ID != 4 || evs[0].Kind != control.KindDomain || evs[2].Target != "a" {
		t.Fatalf("audit after the upgrade = %+v, %v; want the domain as event 4 over events 1 and 2", evs, err)
	}
	var indexes []string
	rows, err := raw(t, path).Query("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' AND tbl_name = 'audit_events' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		rows.Scan(&n)
		indexes = append(indexes, n)
	}
	if want := "audit_events_actor audit_events_at audit_events_kind audit_events_target audit_events_version"; strings.Join(indexes, " ") != want {
		t.Errorf("indexes = %v, want %s", indexes, want)
	}
}
