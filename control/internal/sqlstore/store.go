// Package sqlstore implements control.Store once, over database/sql, for the drivers in
// control/sqlite and control/postgres. A driver brings its connection pool, its named queries
// (the .sql files beside it, with the same names and parameters in both), its migrations and
// a Dialect; the transaction, audit and If-Match logic lives here, so the two databases cannot
// drift apart in meaning.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/control"
)

// Dialect is what differs between the databases besides the SQL text.
type Dialect struct {
	// Queries are the driver's named queries (ParseQueries).
	Queries map[string]string
	// Time encodes a time parameter: microseconds for SQLite, time.Time for PostgreSQL.
	Time func(time.Time) any
	// IsUnique reports a unique-constraint violation; IsCheck a CHECK or NOT NULL violation.
	IsUnique, IsCheck func(error) bool
	// ReadTx are the options of Load's transaction: one snapshot for every table.
	ReadTx *sql.TxOptions
}

// Config is what a driver hands New.
type Config struct {
	DB      *sql.DB
	Dialect Dialect
	// Hub carries this store's Watch channels; Close closes it.
	Hub *Hub
	// Publish announces a committed version; Hub.Publish when nil. SQLite hands it to the
	// hubs of every Store of the process on the same file.
	Publish func(int64)
	Now     func() time.Time
	// StartWatch, when set, is called (once) by the first Watch: PostgreSQL starts listening.
	StartWatch func()
	// Close releases what the driver owns besides DB (which Store.Close closes).
	Close func() error
}

// queryNames are the queries every driver must define.
var queryNames = []string{
	"MigrationTableCreate", "MigrationLock", "MigrationList", "MigrationInsert",
	"VersionGet", "VersionBump",
	"RuleList", "RuleGet", "RuleInsert", "RuleUpdate", "RuleDelete",
	"OverrideListActive", "OverrideListExpired", "OverrideGet", "OverrideGetByTarget", "OverrideInsert", "OverrideDelete", "OverrideUpdate",
	"ExemptionListActive", "ExemptionListExpired", "ExemptionGet", "ExemptionGetByTarget", "ExemptionInsert", "ExemptionDelete", "ExemptionUpdate",
	"IdentityList", "IdentityGet", "IdentityInsert", "IdentityUpdate", "IdentityDelete",
	"DomainList", "DomainGet", "DomainInsert", "DomainUpdate", "DomainDelete",
	"TokenList", "TokenGet", "TokenGetByHash", "TokenInsert", "TokenDelete", "TokenUsed", "TokenRevokedInsert", "TokenRevokedGet",
	"AuditInsert", "AuditList", "AuditPrune",
	"NodeUpsert", "NodeList", "NodePrune",
	"UsageAdd", "ViolationAdd", "UsageHistory", "ViolationList", "UsagePrune", "ViolationPrune",
	"LeaseAcquire", "LeaseGet", "LeaseRelease",
	"UsageTotals", "ViolationTotalsNoTenant",
	"AuditSince", "OverrideListSince", "IdentityListSince",
}

// CheckQueries returns an error naming the first query a driver forgot.
func CheckQueries(queries map[string]string) error {
	for _, n := range queryNames {
		if queries[n] == "" {
			return fmt.Errorf("query %s is missing", n)
		}
	}
	return nil
}

// Store implements control.Store over database/sql.
type Store struct {
	db        *sql.DB
	d         Dialect
	q         map[string]string
	hub       *Hub
	publish   func(int64)
	now       func() time.Time
	watchOnce sync.Once
	start     func()
	closeOnce sync.Once
	closeFn   func() error
	closeErr  error
}

var _ control.Store = (*Store)(nil)

// New returns a Store; the driver has migrated cfg.DB already.
func New(cfg Config) (*Store, error) {
	if err := CheckQueries(cfg.Dialect.Queries); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	publish := cfg.Publish
	if publish == nil {
		publish = cfg.Hub.Publish
	}
	return &Store{
		db: cfg.DB, d: cfg.Dialect, q: cfg.Dialect.Queries, hub: cfg.Hub, publish: publish, now: now,
		start: cfg.StartWatch, closeFn: cfg.Close,
	}, nil
}

// clock returns now in the form stored: UTC, microseconds (PostgreSQL's precision).
func (s *Store) clock() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// Time bounds for filters, inside both databases' ranges.
var (
	minTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// checkTime refuses times neither database represents the same way.
func checkTime(field string, t time.Time) error {
	if t.Before(time.Unix(0, 0)) || t.After(maxTime) {
		return &control.InvalidError{Field: field, Msg: "must be between 1970 and 9999"}
	}
	return nil
}

// ts scans a time stored as microseconds (SQLite) or timestamptz (PostgreSQL).
type ts struct{ t *time.Time }

func (s ts) Scan(src any) error {
	switch v := src.(type) {
	case int64:
		*s.t = time.UnixMicro(v).UTC()
	case time.Time:
		*s.t = v.UTC()
	default:
		return fmt.Errorf("scan time: unexpected %T", src)
	}
	return nil
}

// nullTS scans a time that may be NULL into a pointer.
type nullTS struct{ t **time.Time }

func (s nullTS) Scan(src any) error {
	if src == nil {
		*s.t = nil
		return nil
	}
	var t time.Time
	if err := (ts{&t}).Scan(src); err != nil {
		return err
	}
	*s.t = &t
	return nil
}

// rawJSON scans a nullable text column into json.RawMessage.
type rawJSON struct{ m *json.RawMessage }

func (r rawJSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*r.m = nil
	case string:
		*r.m = json.RawMessage(v)
	case []byte:
		*r.m = json.RawMessage(append([]byte(nil), v...))
	default:
		return fmt.Errorf("scan json: unexpected %T", src)
	}
	return nil
}

// nullJSON is a JSON parameter: NULL for none.
func nullJSON(m json.RawMessage) any {
	if m == nil {
		return nil
	}
	return string(m)
}

// querier is what both *sql.DB and *sql.Tx offer.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// mapErr turns constraint violations into the control sentinels.
func (s *Store) mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case s.d.IsUnique(err):
		return fmt.Errorf("%w: %v", control.ErrConflict, err)
	case s.d.IsCheck(err):
		return &control.InvalidError{Field: "", Msg: "refused by the schema: " + err.Error()}
	}
	return err
}

// progressEvery is how many rows list reads between reports of progress: often enough that a
// slow machine reports well within a deadline, seldom enough to cost nothing per row.
const progressEvery = 256

// list runs query and scans each row with scan, reporting progress (control.ReportProgress)
// when the query answers and every progressEvery rows.
func list[T any](ctx context.Context, q querier, query string, scan func(*sql.Rows) (T, error), args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	control.ReportProgress(ctx)
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if len(out)%progressEvery == 0 {
			control.ReportProgress(ctx)
		}
	}
	return out, rows.Err()
}

// one runs query and scans its single row; ErrNotFound when there is none.
func one[T any](ctx context.Context, q querier, query string, scan func(*sql.Rows) (T, error), args ...any) (T, error) {
	var zero T
	out, err := list(ctx, q, query, scan, args...)
	if err != nil {
		return zero, err
	}
	if len(out) == 0 {
		return zero, control.ErrNotFound
	}
	return out[0], nil
}

// tx is one change in progress: the transaction, its control version and its time.
type tx struct {
	s       *Store
	tx      *sql.Tx
	ctx     context.Context
	version int64
	now     time.Time
	ch      control.Change
}

// change runs fn in a write transaction that first bumps the control version, then commits
// and publishes the new version. Any error from fn rolls everything back, audit included.
func (s *Store) change(ctx context.Context, ch control.Change, fn func(t *tx) error) (int64, error) {
	if err := ch.Validate(); err != nil {
		return 0, err
	}
	sqlTx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer sqlTx.Rollback() //nolint:errcheck // a no-op after Commit
	t := &tx{s: s, tx: sqlTx, ctx: ctx, now: s.clock(), ch: ch}
	if err := sqlTx.QueryRowContext(ctx, s.q["VersionBump"]).Scan(&t.version); err != nil {
		return 0, fmt.Errorf("bump version: %w", err)
	}
	if err := fn(t); err != nil {
		return 0, s.mapErr(err)
	}
	if q := s.q["VersionNotify"]; q != "" {
		if _, err := sqlTx.ExecContext(ctx, q, strconv.FormatInt(t.version, 10)); err != nil {
			return 0, fmt.Errorf("notify: %w", err)
		}
	}
	if err := sqlTx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", s.mapErr(err))
	}
	s.publish(t.version)
	return t.version, nil
}

// audit writes the event of this change; the change's own Action, when it has one, names it.
func (t *tx) audit(kind control.Kind, action control.Action, target string, before, after any, reason string) error {
	args, err := t.auditArgs(kind, action, target, before, after, reason)
	if err != nil {
		return err
	}
	var id int64
	return t.tx.QueryRowContext(t.ctx, t.s.q["AuditInsert"], args...).Scan(&id)
}

// auditArgs are the AuditInsert arguments of an event of this change: its reason and action
// win over the event's own, and before and after are stored as JSON.
func (t *tx) auditArgs(kind control.Kind, action control.Action, target string, before, after any, reason string) ([]any, error) {
	if t.ch.Reason != "" {
		reason = t.ch.Reason
	}
	if t.ch.Action != "" {
		action = t.ch.Action
	}
	enc := func(v any) (any, error) {
		if v == nil {
			return nil, nil
		}
		if m, ok := v.(json.RawMessage); ok {
			return string(m), nil
		}
		b, err := json.Marshal(v)
		return string(b), err
	}
	b, err := enc(before)
	if err != nil {
		return nil, err
	}
	a, err := enc(after)
	if err != nil {
		return nil, err
	}
	return []any{t.s.d.Time(t.now), t.ch.Actor, string(action), string(kind), target, b, a, reason, t.version}, nil
}

// ifMatch applies Change.IfMatch to a resource at version (exists false: there is none).
func ifMatch(want string, exists bool, version int64) error {
	if want == "" {
		return nil
	}
	if !exists || (want != "*" && want != control.ETag(version)) {
		return control.ErrPreconditionFailed
	}
	return nil
}

// ---- versions, watching, loading, expiry

// Version implements control.Store.
func (s *Store) Version(ctx context.Context) (int64, error) {
	var v int64
	if err := s.db.QueryRowContext(ctx, s.q["VersionGet"]).Scan(&v); err != nil {
		return 0, fmt.Errorf("control version: %w", err)
	}
	return v, nil
}

// Watch implements control.Store.
func (s *Store) Watch(ctx context.Context) <-chan int64 {
	ch := s.hub.Subscribe(ctx)
	if s.start != nil {
		s.watchOnce.Do(s.start)
	}
	return ch
}

// Load implements control.Store.
func (s *Store) Load(ctx context.Context) (*control.State, error) {
	tx, err := s.db.BeginTx(ctx, s.d.ReadTx)
	if err != nil {
		return nil, fmt.Errorf("load: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	st := &control.State{At: s.clock()}
	// The version first: on SQLite the snapshot starts with the first read, so every later
	// read in this transaction sees exactly this version.
	if err := tx.QueryRowContext(ctx, s.q["VersionGet"]).Scan(&st.Version); err != nil {
		return nil, fmt.Errorf("load: version: %w", err)
	}
	now := s.d.Time(st.At)
	if st.Rules, err = list(ctx, tx, s.q["RuleList"], scanRule); err != nil {
		return nil, fmt.Errorf("load: rules: %w", err)
	}
	if st.Overrides, err = list(ctx, tx, s.q["OverrideListActive"], scanOverride, now, "", "", "", "", int64(0), pageLimit(0)); err != nil {
		return nil, fmt.Errorf("load: overrides: %w", err)
	}
	if st.Exemptions, err = list(ctx, tx, s.q["ExemptionListActive"], scanExemption, now); err != nil {
		return nil, fmt.Errorf("load: exemptions: %w", err)
	}
	if st.Identities, err = list(ctx, tx, s.q["IdentityList"], scanIdentity, ""); err != nil {
		return nil, fmt.Errorf("load: identities: %w", err)
	}
	if st.Domains, err = list(ctx, tx, s.q["DomainList"], scanDomain); err != nil {
		return nil, fmt.Errorf("load: domains: %w", err)
	}
	return st, nil
}

// errNothing rolls back an Expire that found nothing, so the version does not move.
var errNothing = errors.New("nothing expired")

// Expire implements control.Store.
func (s *Store) Expire(ctx context.Context) (int, int64, error) {
	n := 0
	v, err := s.change(ctx, control.Change{Actor: control.ActorSystem}, func(t *tx) error {
		overrides, err := list(ctx, t.tx, s.q["OverrideListExpired"], scanOverride, s.d.Time(t.now))
		if err != nil {
			return err
		}
		for _, o := range overrides {
			if err := t.expireOverride(o); err != nil {
				return err
			}
		}
		exemptions, err := list(ctx, t.tx, s.q["ExemptionListExpired"], scanExemption, s.d.Time(t.now))
		if err != nil {
			return err
		}
		for _, e := range exemptions {
			if err := t.expireExemption(e); err != nil {
				return err
			}
		}
		n = len(overrides) + len(exemptions)
		if n == 0 {
			return errNothing
		}
		return nil
	})
	if errors.Is(err, errNothing) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("expire: %w", err)
	}
	return n, v, nil
}

// ---- nodes

func scanNode(r *sql.Rows) (control.Node, error) {
	var n control.Node
	var stats string
	err := r.Scan(&n.ID, &n.Addr, &n.PolicyVersion, ts{&n.SeenAt}, &stats)
	if stats != "" {
		n.Stats = []byte(stats)
	}
	return n, err
}

// Heartbeat implements control.Store.
func (s *Store) Heartbeat(ctx context.Context, n control.Node) error {
	if err := n.Validate(); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, s.q["NodeUpsert"], n.ID, n.Addr, n.PolicyVersion, s.d.Time(s.clock()), string(n.Stats)); err != nil {
		return fmt.Errorf("heartbeat %q: %w", n.ID, s.mapErr(err))
	}
	return nil
}

// Nodes implements control.Store.
func (s *Store) Nodes(ctx context.Context, since time.Time) ([]control.Node, error) {
	out, err := list(ctx, s.db, s.q["NodeList"], scanNode, s.d.Time(clampTime(since)))
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// PruneNodes implements control.Store.
func (s *Store) PruneNodes(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.q["NodePrune"], s.d.Time(clampTime(before)))
	if err != nil {
		return 0, fmt.Errorf("prune nodes: %w", err)
	}
	return res.RowsAffected()
}

// Ping implements control.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("control store ping: %w", err)
	}
	return nil
}

// Close implements control.Store. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.hub.Close()
		errs := []error{s.db.Close()}
		if s.closeFn != nil {
			errs = append(errs, s.closeFn())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
