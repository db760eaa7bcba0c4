package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	if err := db.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n != 2 {
		t.Errorf("schema_migrations has %d rows, %v; want 2", n, err)
	}
	for _, table := range []string{"usage_minutes", "violation_minutes", "leases"} {
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
