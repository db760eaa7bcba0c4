// Package sqlstore implements control.Store once, over database/sql, for the drivers in
// control/sqlite and control/postgres. A driver brings its connection pool, its named queries
// (the .sql files beside it, with the same names and parameters in both), its migrations and
// a Dialect; the transaction, audit and If-Match logic lives here, so the two databases cannot
// drift apart in meaning.
package sqlstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	"OverrideListActive", "OverrideListExpired", "OverrideGet", "OverrideGetByTarget", "OverrideInsert", "OverrideDelete",
	"ExemptionListActive", "ExemptionListExpired", "ExemptionGet", "ExemptionGetByTarget", "ExemptionInsert", "ExemptionDelete",
	"IdentityList", "IdentityGet", "IdentityInsert", "IdentityUpdate", "IdentityDelete",
	"TokenList", "TokenGet", "TokenGetByHash", "TokenInsert", "TokenDelete",
	"AuditInsert", "AuditList", "AuditPrune",
	"NodeUpsert", "NodeList", "NodePrune",
	"UsageAdd", "ViolationAdd", "UsageHistory", "ViolationList", "UsagePrune", "ViolationPrune",
	"LeaseAcquire", "LeaseGet", "LeaseRelease",
	"UsageTotals", "ViolationTotalsNoTenant",
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
		return err
	}
	a, err := enc(after)
	if err != nil {
		return err
	}
	var id int64
	return t.tx.QueryRowContext(t.ctx, t.s.q["AuditInsert"], t.s.d.Time(t.now), t.ch.Actor,
		string(action), string(kind), target, b, a, reason, t.version).Scan(&id)
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

// ---- rules

func scanRule(r *sql.Rows) (control.Rule, error) {
	var x control.Rule
	var body string
	err := r.Scan(&x.Name, &body, ts{&x.CreatedAt}, ts{&x.UpdatedAt}, &x.UpdatedBy, &x.Version)
	x.Body = json.RawMessage(body)
	return x, err
}

// ListRules implements control.Store.
func (s *Store) ListRules(ctx context.Context) ([]control.Rule, error) {
	out, err := list(ctx, s.db, s.q["RuleList"], scanRule)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	return out, nil
}

// GetRule implements control.Store.
func (s *Store) GetRule(ctx context.Context, name string) (control.Rule, error) {
	r, err := one(ctx, s.db, s.q["RuleGet"], scanRule, name)
	if err != nil {
		return r, fmt.Errorf("get rule %q: %w", name, err)
	}
	return r, nil
}

// CreateRule implements control.Store.
func (s *Store) CreateRule(ctx context.Context, ch control.Change, name string, body json.RawMessage) (control.Rule, error) {
	return s.putRule(ctx, ch, name, body, true)
}

// UpdateRule implements control.Store.
func (s *Store) UpdateRule(ctx context.Context, ch control.Change, name string, body json.RawMessage) (control.Rule, error) {
	return s.putRule(ctx, ch, name, body, false)
}

func (s *Store) putRule(ctx context.Context, ch control.Change, name string, body json.RawMessage, create bool) (control.Rule, error) {
	op := "update"
	if create {
		op = "create"
	}
	if err := control.ValidateRule(name, body); err != nil {
		return control.Rule{}, fmt.Errorf("%s rule: %w", op, err)
	}
	var out control.Rule
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["RuleGet"], scanRule, name)
		exists := err == nil
		if err != nil && !errors.Is(err, control.ErrNotFound) {
			return err
		}
		switch {
		case create && exists:
			return control.ErrConflict
		case !create && !exists && ch.IfMatch == "":
			return control.ErrNotFound
		}
		if err := ifMatch(ch.IfMatch, exists, old.Version); err != nil {
			return err
		}
		out = control.Rule{Name: name, Body: body, CreatedAt: t.now, UpdatedAt: t.now, UpdatedBy: ch.Actor, Version: t.version}
		if create {
			_, err = t.tx.ExecContext(ctx, s.q["RuleInsert"], name, string(body), s.d.Time(t.now), ch.Actor, t.version)
			if err != nil {
				return err
			}
			return t.audit(control.KindRule, control.ActionCreate, name, nil, body, "")
		}
		out.CreatedAt = old.CreatedAt
		if _, err = t.tx.ExecContext(ctx, s.q["RuleUpdate"], name, string(body), s.d.Time(t.now), ch.Actor, t.version); err != nil {
			return err
		}
		return t.audit(control.KindRule, control.ActionUpdate, name, old.Body, body, "")
	})
	if err != nil {
		return control.Rule{}, fmt.Errorf("%s rule %q: %w", op, name, err)
	}
	return out, nil
}

// DeleteRule implements control.Store.
func (s *Store) DeleteRule(ctx context.Context, ch control.Change, name string) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["RuleGet"], scanRule, name)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["RuleDelete"], name); err != nil {
			return err
		}
		return t.audit(control.KindRule, control.ActionDelete, name, old.Body, nil, "")
	})
	if err != nil {
		return 0, fmt.Errorf("delete rule %q: %w", name, err)
	}
	return v, nil
}

// missing turns the ErrNotFound of a resource a change needs into ErrPreconditionFailed when
// the change was conditional (RFC 9110: If-Match on a missing resource fails).
func (s *Store) missing(ch control.Change, err error) error {
	if errors.Is(err, control.ErrNotFound) && ch.IfMatch != "" {
		return control.ErrPreconditionFailed
	}
	return err
}

// ---- overrides

func scanOverride(r *sql.Rows) (control.Override, error) {
	var o control.Override
	var typ, src string
	err := r.Scan(&o.ID, &o.Tenant, &o.User, &o.APIKey, &o.Endpoint, &o.Rule, &typ, &o.Value, &o.Limit, &o.Burst,
		ts{&o.ExpiresAt}, &o.Reason, &src, &o.CreatedBy, ts{&o.CreatedAt}, &o.Version)
	o.Type, o.Source = control.OverrideType(typ), control.Source(src)
	return o, err
}

// targetKey is the unique key of an override's target: a hash, since the tuple can be longer
// than an index entry. JSON encoding keeps ("a:b","c") and ("a","b:c") apart.
func targetKey(o control.Override) string {
	b, _ := json.Marshal([]string{o.Tenant, o.User, o.APIKey, o.Endpoint, o.Rule})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ListOverrides implements control.Store.
func (s *Store) ListOverrides(ctx context.Context, f control.OverrideFilter) ([]control.Override, error) {
	out, err := list(ctx, s.db, s.q["OverrideListActive"], scanOverride,
		s.d.Time(s.clock()), f.Tenant, f.User, f.APIKey, string(f.Source))
	if err != nil {
		return nil, fmt.Errorf("list overrides: %w", err)
	}
	return out, nil
}

// GetOverride implements control.Store.
func (s *Store) GetOverride(ctx context.Context, id int64) (control.Override, error) {
	o, err := one(ctx, s.db, s.q["OverrideGet"], scanOverride, id)
	if err != nil {
		return o, fmt.Errorf("get override %d: %w", id, err)
	}
	return o, nil
}

// CreateOverride implements control.Store.
func (s *Store) CreateOverride(ctx context.Context, ch control.Change, o control.Override) (control.Override, error) {
	o.ExpiresAt = o.ExpiresAt.UTC().Truncate(time.Microsecond)
	if err := o.Validate(); err != nil {
		return control.Override{}, fmt.Errorf("create override: %w", err)
	}
	if err := checkTime("expires_at", o.ExpiresAt); err != nil {
		return control.Override{}, fmt.Errorf("create override: %w", err)
	}
	_, err := s.change(ctx, ch, func(t *tx) error {
		if !o.ExpiresAt.After(t.now) {
			return &control.InvalidError{Field: "expires_at", Msg: "must be in the future"}
		}
		key := targetKey(o)
		old, err := one(ctx, t.tx, s.q["OverrideGetByTarget"], scanOverride, key)
		live := err == nil && old.ExpiresAt.After(t.now)
		var replaced any // the override o replaces (If-Match), for the audit event
		switch {
		case err != nil && !errors.Is(err, control.ErrNotFound):
			return err
		case ch.IfMatch != "":
			// A replacement: the target's live override, at the version the caller saw.
			if err := ifMatch(ch.IfMatch, live, old.Version); err != nil {
				return err
			}
			if _, err := t.tx.ExecContext(ctx, s.q["OverrideDelete"], old.ID); err != nil {
				return err
			}
			replaced = old
		case live:
			return fmt.Errorf("%w: override %d has the same target", control.ErrConflict, old.ID)
		case err == nil:
			// Expired but not collected yet: collect it now, or it would block its successor.
			if err := t.expireOverride(old); err != nil {
				return err
			}
		}
		o.CreatedBy, o.CreatedAt, o.Version = ch.Actor, t.now, t.version
		if err := t.tx.QueryRowContext(ctx, s.q["OverrideInsert"], key, o.Tenant, o.User, o.APIKey, o.Endpoint, o.Rule,
			string(o.Type), o.Value, o.Limit, o.Burst, s.d.Time(o.ExpiresAt), o.Reason, string(o.Source),
			o.CreatedBy, s.d.Time(o.CreatedAt), o.Version).Scan(&o.ID); err != nil {
			return err
		}
		action := control.ActionCreate
		if replaced != nil {
			action = control.ActionUpdate
		}
		return t.audit(control.KindOverride, action, strconv.FormatInt(o.ID, 10), replaced, o, o.Reason)
	})
	if err != nil {
		return control.Override{}, fmt.Errorf("create override: %w", err)
	}
	return o, nil
}

// expireOverride deletes an expired override with its audit event, as ActorSystem.
func (t *tx) expireOverride(o control.Override) error {
	if _, err := t.tx.ExecContext(t.ctx, t.s.q["OverrideDelete"], o.ID); err != nil {
		return err
	}
	sub := *t
	sub.ch = control.Change{Actor: control.ActorSystem}
	return sub.audit(control.KindOverride, control.ActionExpire, strconv.FormatInt(o.ID, 10), o, nil, o.Reason)
}

// DeleteOverride implements control.Store.
func (s *Store) DeleteOverride(ctx context.Context, ch control.Change, id int64) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["OverrideGet"], scanOverride, id)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["OverrideDelete"], id); err != nil {
			return err
		}
		return t.audit(control.KindOverride, control.ActionDelete, strconv.FormatInt(id, 10), old, nil, old.Reason)
	})
	if err != nil {
		return 0, fmt.Errorf("delete override %d: %w", id, err)
	}
	return v, nil
}

// ---- exemptions

func scanExemption(r *sql.Rows) (control.Exemption, error) {
	var e control.Exemption
	err := r.Scan(&e.ID, &e.APIKey, &e.User, &e.Tenant, &e.IP, &e.Reason, nullTS{&e.ExpiresAt},
		&e.CreatedBy, ts{&e.CreatedAt}, &e.Version)
	return e, err
}

// active reports whether e has not expired at now.
func active(e control.Exemption, now time.Time) bool {
	return e.ExpiresAt == nil || e.ExpiresAt.After(now)
}

// ListExemptions implements control.Store.
func (s *Store) ListExemptions(ctx context.Context) ([]control.Exemption, error) {
	out, err := list(ctx, s.db, s.q["ExemptionListActive"], scanExemption, s.d.Time(s.clock()))
	if err != nil {
		return nil, fmt.Errorf("list exemptions: %w", err)
	}
	return out, nil
}

// GetExemption implements control.Store.
func (s *Store) GetExemption(ctx context.Context, id int64) (control.Exemption, error) {
	e, err := one(ctx, s.db, s.q["ExemptionGet"], scanExemption, id)
	if err != nil {
		return e, fmt.Errorf("get exemption %d: %w", id, err)
	}
	return e, nil
}

// CreateExemption implements control.Store.
func (s *Store) CreateExemption(ctx context.Context, ch control.Change, e control.Exemption) (control.Exemption, error) {
	if e.ExpiresAt != nil {
		t := e.ExpiresAt.UTC().Truncate(time.Microsecond)
		e.ExpiresAt = &t
	}
	if err := e.Validate(); err != nil {
		return control.Exemption{}, fmt.Errorf("create exemption: %w", err)
	}
	var expires any
	if e.ExpiresAt != nil {
		if err := checkTime("expires_at", *e.ExpiresAt); err != nil {
			return control.Exemption{}, fmt.Errorf("create exemption: %w", err)
		}
		expires = s.d.Time(*e.ExpiresAt)
	}
	_, err := s.change(ctx, ch, func(t *tx) error {
		if !active(e, t.now) {
			return &control.InvalidError{Field: "expires_at", Msg: "must be in the future"}
		}
		if ch.IfMatch != "" {
			return control.ErrPreconditionFailed
		}
		old, err := one(ctx, t.tx, s.q["ExemptionGetByTarget"], scanExemption, e.APIKey, e.User, e.Tenant, e.IP)
		switch {
		case err == nil && active(old, t.now):
			return fmt.Errorf("%w: exemption %d names the same caller", control.ErrConflict, old.ID)
		case err == nil:
			if err := t.expireExemption(old); err != nil {
				return err
			}
		case !errors.Is(err, control.ErrNotFound):
			return err
		}
		e.CreatedBy, e.CreatedAt, e.Version = ch.Actor, t.now, t.version
		if err := t.tx.QueryRowContext(ctx, s.q["ExemptionInsert"], e.APIKey, e.User, e.Tenant, e.IP, e.Reason, expires,
			e.CreatedBy, s.d.Time(e.CreatedAt), e.Version).Scan(&e.ID); err != nil {
			return err
		}
		return t.audit(control.KindExemption, control.ActionCreate, strconv.FormatInt(e.ID, 10), nil, e, e.Reason)
	})
	if err != nil {
		return control.Exemption{}, fmt.Errorf("create exemption: %w", err)
	}
	return e, nil
}

// expireExemption deletes an expired exemption with its audit event, as ActorSystem.
func (t *tx) expireExemption(e control.Exemption) error {
	if _, err := t.tx.ExecContext(t.ctx, t.s.q["ExemptionDelete"], e.ID); err != nil {
		return err
	}
	sub := *t
	sub.ch = control.Change{Actor: control.ActorSystem}
	return sub.audit(control.KindExemption, control.ActionExpire, strconv.FormatInt(e.ID, 10), e, nil, e.Reason)
}

// DeleteExemption implements control.Store.
func (s *Store) DeleteExemption(ctx context.Context, ch control.Change, id int64) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["ExemptionGet"], scanExemption, id)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["ExemptionDelete"], id); err != nil {
			return err
		}
		return t.audit(control.KindExemption, control.ActionDelete, strconv.FormatInt(id, 10), old, nil, old.Reason)
	})
	if err != nil {
		return 0, fmt.Errorf("delete exemption %d: %w", id, err)
	}
	return v, nil
}

// ---- identities

func scanIdentity(r *sql.Rows) (control.Identity, error) {
	var i control.Identity
	var kind string
	var trust sql.NullFloat64
	err := r.Scan(&kind, &i.Value, &i.Tier, &i.Tenant, &i.User, &trust, &i.UpdatedBy, ts{&i.UpdatedAt}, &i.Version)
	i.Kind = control.IdentityKind(kind)
	if trust.Valid {
		i.Trust = &trust.Float64
	}
	return i, err
}

// identityTarget is an identity's audit target.
func identityTarget(kind control.IdentityKind, value string) string {
	return string(kind) + "/" + value
}

// ListIdentities implements control.Store.
func (s *Store) ListIdentities(ctx context.Context, kind control.IdentityKind) ([]control.Identity, error) {
	out, err := list(ctx, s.db, s.q["IdentityList"], scanIdentity, string(kind))
	if err != nil {
		return nil, fmt.Errorf("list identities: %w", err)
	}
	return out, nil
}

// GetIdentity implements control.Store.
func (s *Store) GetIdentity(ctx context.Context, kind control.IdentityKind, value string) (control.Identity, error) {
	i, err := one(ctx, s.db, s.q["IdentityGet"], scanIdentity, string(kind), value)
	if err != nil {
		return i, fmt.Errorf("get identity %s: %w", identityTarget(kind, strconv.Quote(value)), err)
	}
	return i, nil
}

// PutIdentity implements control.Store.
func (s *Store) PutIdentity(ctx context.Context, ch control.Change, id control.Identity) (control.Identity, bool, error) {
	if err := id.Validate(); err != nil {
		return control.Identity{}, false, fmt.Errorf("put identity: %w", err)
	}
	var created bool
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["IdentityGet"], scanIdentity, string(id.Kind), id.Value)
		exists := err == nil
		if err != nil && !errors.Is(err, control.ErrNotFound) {
			return err
		}
		if err := ifMatch(ch.IfMatch, exists, old.Version); err != nil {
			return err
		}
		created = !exists
		id.UpdatedBy, id.UpdatedAt, id.Version = ch.Actor, t.now, t.version
		var trust any
		if id.Trust != nil {
			trust = *id.Trust
		}
		q, action, before := s.q["IdentityUpdate"], control.ActionUpdate, any(old)
		if created {
			q, action, before = s.q["IdentityInsert"], control.ActionCreate, nil
		}
		if _, err := t.tx.ExecContext(ctx, q, string(id.Kind), id.Value, id.Tier, id.Tenant, id.User, trust,
			id.UpdatedBy, s.d.Time(id.UpdatedAt), id.Version); err != nil {
			return err
		}
		return t.audit(control.KindIdentity, action, identityTarget(id.Kind, id.Value), before, id, "")
	})
	if err != nil {
		return control.Identity{}, false, fmt.Errorf("put identity %s: %w", identityTarget(id.Kind, strconv.Quote(id.Value)), err)
	}
	return id, created, nil
}

// DeleteIdentity implements control.Store.
func (s *Store) DeleteIdentity(ctx context.Context, ch control.Change, kind control.IdentityKind, value string) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["IdentityGet"], scanIdentity, string(kind), value)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["IdentityDelete"], string(kind), value); err != nil {
			return err
		}
		return t.audit(control.KindIdentity, control.ActionDelete, identityTarget(kind, value), old, nil, "")
	})
	if err != nil {
		return 0, fmt.Errorf("delete identity %s: %w", identityTarget(kind, strconv.Quote(value)), err)
	}
	return v, nil
}

// ---- tokens

func scanToken(r *sql.Rows) (control.Token, error) {
	var t control.Token
	var role string
	var hash []byte
	if err := r.Scan(&t.Name, &role, &hash, &t.CreatedBy, ts{&t.CreatedAt}, &t.Version); err != nil {
		return t, err
	}
	t.Role = control.Role(role)
	if copy(t.Hash[:], hash) != len(t.Hash) {
		return t, fmt.Errorf("token %q: stored hash has %d bytes", t.Name, len(hash))
	}
	return t, nil
}

// ListTokens implements control.Store.
func (s *Store) ListTokens(ctx context.Context) ([]control.Token, error) {
	out, err := list(ctx, s.db, s.q["TokenList"], scanToken)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return out, nil
}

// GetToken implements control.Store.
func (s *Store) GetToken(ctx context.Context, name string) (control.Token, error) {
	t, err := one(ctx, s.db, s.q["TokenGet"], scanToken, name)
	if err != nil {
		return t, fmt.Errorf("get token %q: %w", name, err)
	}
	return t, nil
}

// TokenByHash implements control.Store.
func (s *Store) TokenByHash(ctx context.Context, h control.TokenHash) (control.Token, error) {
	t, err := one(ctx, s.db, s.q["TokenGetByHash"], scanToken, h[:])
	if err != nil {
		return t, fmt.Errorf("token by hash: %w", err)
	}
	return t, nil
}

// CreateToken implements control.Store.
func (s *Store) CreateToken(ctx context.Context, ch control.Change, tok control.Token) (control.Token, error) {
	if err := tok.Validate(); err != nil {
		return control.Token{}, fmt.Errorf("create token: %w", err)
	}
	_, err := s.change(ctx, ch, func(t *tx) error {
		if _, err := one(ctx, t.tx, s.q["TokenGet"], scanToken, tok.Name); err == nil {
			return control.ErrConflict
		} else if !errors.Is(err, control.ErrNotFound) {
			return err
		}
		if ch.IfMatch != "" {
			return control.ErrPreconditionFailed
		}
		tok.CreatedBy, tok.CreatedAt, tok.Version = ch.Actor, t.now, t.version
		if _, err := t.tx.ExecContext(ctx, s.q["TokenInsert"], tok.Name, string(tok.Role), tok.Hash[:],
			tok.CreatedBy, s.d.Time(tok.CreatedAt), tok.Version); err != nil {
			return err // a taken hash is a unique violation: ErrConflict
		}
		return t.audit(control.KindToken, control.ActionCreate, tok.Name, nil, tok, "")
	})
	if err != nil {
		return control.Token{}, fmt.Errorf("create token %q: %w", tok.Name, err)
	}
	return tok, nil
}

// DeleteToken implements control.Store.
func (s *Store) DeleteToken(ctx context.Context, ch control.Change, name string) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["TokenGet"], scanToken, name)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["TokenDelete"], name); err != nil {
			return err
		}
		return t.audit(control.KindToken, control.ActionDelete, name, old, nil, "")
	})
	if err != nil {
		return 0, fmt.Errorf("delete token %q: %w", name, err)
	}
	return v, nil
}

// ---- audit

func scanAudit(r *sql.Rows) (control.AuditEvent, error) {
	var e control.AuditEvent
	var action, kind string
	err := r.Scan(&e.ID, ts{&e.At}, &e.Actor, &action, &kind, &e.Target, rawJSON{&e.Before}, rawJSON{&e.After}, &e.Reason, &e.Version)
	e.Action, e.Kind = control.Action(action), control.Kind(kind)
	return e, err
}

// AppendAudit implements control.Store.
func (s *Store) AppendAudit(ctx context.Context, e control.AuditEvent) (control.AuditEvent, error) {
	if err := e.Validate(); err != nil {
		return control.AuditEvent{}, fmt.Errorf("append audit: %w", err)
	}
	e.At, e.Version = s.clock(), 0
	err := s.db.QueryRowContext(ctx, s.q["AuditInsert"], s.d.Time(e.At), e.Actor, string(e.Action), string(e.Kind),
		e.Target, nullJSON(e.Before), nullJSON(e.After), e.Reason, e.Version).Scan(&e.ID)
	if err != nil {
		return control.AuditEvent{}, fmt.Errorf("append audit: %w", s.mapErr(err))
	}
	return e, nil
}

// Audit implements control.Store.
func (s *Store) Audit(ctx context.Context, f control.AuditFilter) ([]control.AuditEvent, error) {
	since, until := f.Since, f.Until
	if since.IsZero() || since.Before(minTime) {
		since = minTime
	}
	if until.IsZero() || until.After(maxTime) {
		until = maxTime
	}
	before := f.BeforeID
	if before <= 0 {
		before = math.MaxInt64
	}
	limit := f.Limit
	switch {
	case limit <= 0:
		limit = control.DefaultAuditLimit
	case limit > control.MaxAuditLimit:
		limit = control.MaxAuditLimit
	}
	out, err := list(ctx, s.db, s.q["AuditList"], scanAudit, s.d.Time(since.UTC()), s.d.Time(until.UTC()),
		f.Actor, string(f.Action), string(f.Kind), f.Target, before, int64(limit))
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

// PruneAudit implements control.Store.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.q["AuditPrune"], s.d.Time(clampTime(before)))
	if err != nil {
		return 0, fmt.Errorf("prune audit: %w", err)
	}
	return res.RowsAffected()
}

// clampTime keeps a caller's time inside what both databases represent.
func clampTime(t time.Time) time.Time {
	switch {
	case t.Before(minTime):
		return minTime
	case t.After(maxTime):
		return maxTime
	}
	return t.UTC()
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
	if st.Overrides, err = list(ctx, tx, s.q["OverrideListActive"], scanOverride, now, "", "", "", ""); err != nil {
		return nil, fmt.Errorf("load: overrides: %w", err)
	}
	if st.Exemptions, err = list(ctx, tx, s.q["ExemptionListActive"], scanExemption, now); err != nil {
		return nil, fmt.Errorf("load: exemptions: %w", err)
	}
	if st.Identities, err = list(ctx, tx, s.q["IdentityList"], scanIdentity, ""); err != nil {
		return nil, fmt.Errorf("load: identities: %w", err)
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
