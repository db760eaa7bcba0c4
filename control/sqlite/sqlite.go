// Package sqlite is the embedded control store: one SQLite file, <data-dir>/control.db, with
// the pure-Go driver modernc.org/sqlite, so the sluice binary stays static (CGO_ENABLED=0).
// It serves one node; a fleet shares control/postgres.
//
// The file runs in WAL mode (readers never wait for the writer) with a busy timeout; writes are
// BEGIN IMMEDIATE transactions, so SQLite serializes them. Watch channels hear the changes of
// every Store of this process on the same file at once; writers in other processes are seen by
// the callers' Version poll.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/internal/sqlstore"
)

//go:embed sql
var files embed.FS

// FileName is the control store's file inside the data directory.
const FileName = "control.db"

// busyTimeout is how long a statement waits for another connection's lock before failing with
// SQLITE_BUSY. Writes are short (one change and its audit event), so 5 s only trips on a stuck
// writer, such as a second process holding the file.
const busyTimeout = 5 * time.Second

// Store is the SQLite control store; its methods are control.Store's.
type Store struct {
	*sqlstore.Store
}

// Path returns the control store's path in dataDir.
func Path(dataDir string) string { return filepath.Join(dataDir, FileName) }

// Open opens (creating if needed) the control store at path, and its folder with mode 0700,
// and applies the schema migrations it lacks. The file is mode 0600, whatever the umask or an
// older version left: it holds customers' API keys (identities, overrides, exemptions). SQLite
// gives its -wal and -shm files the database file's mode.
func Open(ctx context.Context, path string, opts control.Options) (*Store, error) {
	queries, err := sqlstore.ParseQueries(files, "sql/queries")
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	if err := private(abs); err != nil {
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(abs))
	if err != nil {
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	// Readers run in parallel with the one writer in WAL mode; a handful of connections is
	// plenty for an admin API and a compile loop.
	db.SetMaxOpenConns(4)
	if err := sqlstore.Migrate(ctx, db, queries, files, "sql/migrations"); err != nil {
		db.Close()
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	hub := sqlstore.NewHub()
	key := registry.add(abs, hub)
	core, err := sqlstore.New(sqlstore.Config{
		DB: db,
		Dialect: sqlstore.Dialect{
			Queries:  queries,
			Time:     func(t time.Time) any { return t.UnixMicro() },
			IsUnique: isCode(sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY),
			IsCheck: isCode(sqlite3.SQLITE_CONSTRAINT_CHECK, sqlite3.SQLITE_CONSTRAINT_NOTNULL,
				sqlite3.SQLITE_CONSTRAINT_DATATYPE),
			// A deferred read transaction: its snapshot starts at its first read and holds
			// for every later one (WAL).
			ReadTx: &sql.TxOptions{ReadOnly: true},
		},
		Hub:     hub,
		Publish: func(v int64) { registry.publish(key, v) },
		Now:     opts.Clock(),
		Close:   func() error { registry.remove(key, hub); return nil },
	})
	if err != nil {
		registry.remove(key, hub)
		db.Close()
		return nil, fmt.Errorf("control store %s: %w", path, err)
	}
	return &Store{core}, nil
}

// private creates the database file with mode 0600 when it is missing, and sets the mode of
// the file and of its -wal and -shm companions to 0600 when they exist.
func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// dsn builds the driver's DSN for path. The path goes in a file: URI, so '?', '#' and '%' in
// it are escaped rather than read as URI syntax.
func dsn(path string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + esc + "?_txlock=immediate" +
		fmt.Sprintf("&_pragma=busy_timeout(%d)", busyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)" +
		// NORMAL is durable in WAL mode except for the last transactions before a power loss;
		// an OS crash of a rate limiter's admin store can afford that, and writes stay fast.
		"&_pragma=synchronous(NORMAL)" +
		"&_pragma=foreign_keys(1)" +
		// Statement journals in memory rather than in temporary files: an import writes a
		// hundred thousand rows in one transaction, and each statement's journal in a file
		// cost it a write system call per row (issue 29).
		"&_pragma=temp_store(MEMORY)"
}

// isCode returns a classifier for SQLite extended result codes.
func isCode(codes ...int) func(error) bool {
	return func(err error) bool {
		var e *sqlite.Error
		if !errors.As(err, &e) {
			return false
		}
		for _, c := range codes {
			if e.Code() == c {
				return true
			}
		}
		return false
	}
}

// registry connects the Stores of this process that share a file, so that a change made
// through one reaches the Watch channels of all. Keyed by the file's absolute path with
// symlinks resolved where possible.
var registry = hubs{m: map[string]map[*sqlstore.Hub]struct{}{}}

type hubs struct {
	mu sync.Mutex
	m  map[string]map[*sqlstore.Hub]struct{}
}

func (r *hubs) add(path string, h *sqlstore.Hub) string {
	key := path
	if real, err := filepath.EvalSymlinks(path); err == nil {
		key = real
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[key] == nil {
		r.m[key] = map[*sqlstore.Hub]struct{}{}
	}
	r.m[key][h] = struct{}{}
	return key
}

func (r *hubs) remove(key string, h *sqlstore.Hub) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m[key], h)
	if len(r.m[key]) == 0 {
		delete(r.m, key)
	}
}

// publish hands v to every hub on key. Hub.Publish never blocks, so holding the lock is fine.
func (r *hubs) publish(key string, v int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h := range r.m[key] {
		h.Publish(v)
	}
}
