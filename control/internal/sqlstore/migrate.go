package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
)

// migrationFile is "NNNN_name.sql".
var migrationFile = regexp.MustCompile(`^(\d{4})_(\w+)\.sql$`)

// Migrate applies the numbered migrations in dir of fsys that schema_migrations does not list
// yet, in order, and records each, all in one transaction: a failed migration leaves the schema
// as it was. The driver's MigrationLock query keeps two processes from migrating at once.
//
// Written by hand (about 50 lines) rather than with golang-migrate or goose: Sluice needs
// only forward migrations from embedded files, applied at open, on two databases whose DDL is
// transactional. Those libraries bring a dependency tree, down files, and "dirty" states
// that a single transaction makes impossible here.
func Migrate(ctx context.Context, db *sql.DB, queries map[string]string, fsys fs.FS, dir string) error {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return fmt.Errorf("read migrations %s: %w", dir, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, q := range []string{"MigrationLock", "MigrationTableCreate"} {
		if _, err := tx.ExecContext(ctx, queries[q]); err != nil {
			return fmt.Errorf("migrate: %s: %w", q, err)
		}
	}
	rows, err := tx.QueryContext(ctx, queries["MigrationList"])
	if err != nil {
		return fmt.Errorf("migrate: list applied: %w", err)
	}
	var applied []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return fmt.Errorf("migrate: list applied: %w", err)
		}
		applied = append(applied, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrate: list applied: %w", err)
	}
	latest := int64(0)
	for _, e := range entries { // ReadDir sorts by name, so by number
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		latest = v
		if slices.Contains(applied, v) {
			continue
		}
		ddl, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if _, err := tx.ExecContext(ctx, string(ddl)); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", e.Name(), err)
		}
		if _, err := tx.ExecContext(ctx, queries["MigrationInsert"], v, m[2]); err != nil {
			return fmt.Errorf("migrate: record %s: %w", e.Name(), err)
		}
	}
	// A database migrated by a newer Sluice may hold tables this binary does not know about;
	// refusing to run is safer than writing around them.
	if len(applied) > 0 && applied[len(applied)-1] > latest {
		return fmt.Errorf("migrate: the database is at schema %d, newer than this binary's %d", applied[len(applied)-1], latest)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}
