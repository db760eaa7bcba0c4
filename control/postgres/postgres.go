// Package postgres is the control store of a fleet: every node opens the same PostgreSQL
// database (github.com/jackc/pgx/v5, a pgxpool behind database/sql), and a change made through
// any node reaches the others through LISTEN/NOTIFY.
//
// Each change's transaction ends with pg_notify('sluice_control', version), which PostgreSQL
// delivers at commit and never for a rollback. A Store listens on its own connection, outside
// the pool, from its first Watch on; when that connection drops it reconnects with backoff
// and, once back, announces the current version, since notifications sent meanwhile are lost.
// No caller ever waits on the listener.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/internal/sqlstore"
)

//go:embed sql
var files embed.FS

// Channel is the NOTIFY channel of control changes; the payload is the new control version.
const Channel = "sluice_control"

// Listener timings.
const (
	// connectTimeout bounds one attempt to open the listening connection.
	connectTimeout = 5 * time.Second
	// The backoff between attempts grows from minBackoff to maxBackoff, so a node hears of
	// changes again within about maxBackoff of the database coming back.
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
	// TCP keepalive on the listening connection: it only reads, so without probes a database
	// host that vanished (no FIN, no RST) would go unnoticed for the kernel's two hours.
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
)

// Store is the PostgreSQL control store; its methods are control.Store's.
type Store struct {
	*sqlstore.Store
}

// Open connects to the database at url (postgres://user:pass@host:5432/db?sslmode=...),
// applies the schema migrations it lacks, and returns the Store. Two nodes starting together
// migrate one after the other. It fails when the database cannot be reached: see OpenLazy.
func Open(ctx context.Context, url string, opts control.Options) (*Store, error) {
	s, m, err := open(url, opts)
	if err != nil {
		return nil, err
	}
	if err := m.ensure(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// OpenLazy is Open for a database that may be down: it fails only for a bad url, and leaves
// connecting and migrating to the first call that needs the database. Until then every call
// fails with the connection's error, as calls do while the database is down later on. A
// node starts with it so that it serves on its last known policy whether or not the control
// store answers, and follows the store once it does.
func OpenLazy(url string, opts control.Options) (*Store, error) {
	s, _, err := open(url, opts)
	return s, err
}

// migrator applies the schema migrations once per Store, on the first connection that works.
type migrator struct {
	cfg     *pgx.ConnConfig
	queries map[string]string
	where   string
	mu      sync.Mutex
	done    atomic.Bool
}

// ensure migrates the database unless it was done already. It runs on a connection of its
// own, outside the pool, since the pool calls it while it sets up one of its connections.
func (m *migrator) ensure(ctx context.Context) error {
	if m.done.Load() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done.Load() {
		return nil
	}
	db := stdlib.OpenDB(*m.cfg.Copy())
	defer db.Close()
	if err := sqlstore.Migrate(ctx, db, m.queries, files, "sql/migrations"); err != nil {
		return fmt.Errorf("control store %s: %w", m.where, err)
	}
	m.done.Store(true)
	return nil
}

// open builds the Store without touching the database. Every connection of its pool is set
// up only once the schema is migrated (the pool's AfterConnect), so no query ever meets a
// database without its tables, however long it was down.
func open(url string, opts control.Options) (*Store, *migrator, error) {
	queries, err := sqlstore.ParseQueries(files, "sql/queries")
	if err != nil {
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message carries the URL with its password redacted.
		return nil, nil, fmt.Errorf("control store: %w", err)
	}
	// Ping every connection the pool hands out, not only those idle for a second (pgxpool's
	// default): after a database restart a pooled connection is dead, and the control plane's
	// few queries a second can afford a round trip more to never fail on one.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	m := &migrator{cfg: cfg.ConnConfig.Copy(), queries: queries, where: where(cfg)}
	cfg.AfterConnect = func(ctx context.Context, _ *pgx.Conn) error { return m.ensure(ctx) }
	// The pool connects on demand: creating it touches no database.
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("control store: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	hub := sqlstore.NewHub()
	l := &listener{
		cfg: cfg.ConnConfig.Copy(), hub: hub, log: opts.Log(), query: queries["VersionGet"],
		done: make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	core, err := sqlstore.New(sqlstore.Config{
		DB: db,
		Dialect: sqlstore.Dialect{
			Queries:  queries,
			Time:     func(t time.Time) any { return t },
			IsUnique: isCode("23505"), // unique_violation
			// check_violation, not_null_violation, string_data_right_truncation,
			// character_not_in_repertoire, untranslatable_character
			IsCheck: isCode("23514", "23502", "22001", "22021", "22P05"),
			// One snapshot for every table of Load.
			ReadTx: &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
		},
		Hub:        hub,
		Now:        opts.Clock(),
		StartWatch: l.start,
		Close: func() error {
			l.stop()
			pool.Close()
			return nil
		},
	})
	if err != nil {
		db.Close()
		pool.Close()
		return nil, nil, fmt.Errorf("control store %s: %w", where(cfg), err)
	}
	return &Store{core}, m, nil
}

// where names the database for errors and logs, without credentials.
func where(cfg *pgxpool.Config) string {
	return fmt.Sprintf("postgres %s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
}

// isCode returns a classifier for PostgreSQL SQLSTATE codes.
func isCode(codes ...string) func(error) bool {
	return func(err error) bool {
		var e *pgconn.PgError
		if !errors.As(err, &e) {
			return false
		}
		for _, c := range codes {
			if e.Code == c {
				return true
			}
		}
		return false
	}
}

// listener holds one LISTEN connection and publishes what it hears to the hub.
type listener struct {
	cfg   *pgx.ConnConfig
	hub   *sqlstore.Hub
	log   *slog.Logger
	query string // VersionGet

	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
	started bool // set inside once; read by stop after its own once.Do
	done    chan struct{}
	failing bool // owned by run: the last attempt failed
}

func (l *listener) start() {
	l.once.Do(func() {
		l.started = true
		go l.run()
	})
}

// stop ends the listener and waits for it.
func (l *listener) stop() {
	l.once.Do(func() {}) // a listener never started stays so
	l.cancel()
	if l.started {
		<-l.done
	}
}

func (l *listener) run() {
	defer close(l.done)
	backoff := minBackoff
	for {
		listened, err := l.listen()
		if l.ctx.Err() != nil {
			return
		}
		// One warning when a working connection is lost, not one per failed retry.
		if listened || !l.failing {
			l.log.Warn("control store: change notifications lost; reconnecting (the version poll still sees changes)",
				"database", l.database(), "err", err)
		}
		l.failing = true
		if listened {
			backoff = minBackoff
		}
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// database names the database for logs, without credentials.
func (l *listener) database() string {
	return fmt.Sprintf("%s:%d/%s", l.cfg.Host, l.cfg.Port, l.cfg.Database)
}

// listen connects, LISTENs, announces the current version and then every notification until
// the connection fails. listened reports whether it got as far as listening.
func (l *listener) listen() (listened bool, _ error) {
	cfg := l.cfg.Copy()
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
	}}
	cfg.DialFunc = dialer.DialContext
	cctx, cancel := context.WithTimeout(l.ctx, connectTimeout)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(l.ctx, "LISTEN "+Channel); err != nil {
		return false, err
	}
	// Changes committed while no connection listened were never heard: announce the current
	// version, which is how a watcher catches up.
	var v int64
	if err := conn.QueryRow(l.ctx, l.query).Scan(&v); err != nil {
		return false, err
	}
	if l.failing {
		l.log.Info("control store: listening for changes again", "database", l.database())
		l.failing = false
	}
	l.hub.Publish(v)
	for {
		n, err := conn.WaitForNotification(l.ctx)
		if err != nil {
			return true, err
		}
		if v, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
			l.hub.Publish(v)
		}
	}
}
