package sqlstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
)

// minute truncates t to its UTC minute and checks it is one both databases hold.
func minute(t time.Time) (time.Time, error) {
	m := t.UTC().Truncate(time.Minute)
	return m, checkTime("minute", m)
}

// identityKey is a violation row's key: a hash of its identity, which can be longer than an
// index entry. JSON keeps ("a:b","c") and ("a","b:c") apart.
func identityKey(v control.ViolationCount) string {
	b, _ := json.Marshal([]string{v.Tenant, v.User, v.APIKey, v.IP, v.Endpoint})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// countsChunk is how many rows one statement of AddCounts upserts: one JSON parameter of a
// few hundred kilobytes, rather than one round trip per row. Row by row, a large flush took
// longer than the flush interval on PostgreSQL (BenchmarkAddCounts; docs/measurements.md).
const countsChunk = 5000

// AddCounts implements control.Store. Rows are upserted chunkwise from one JSON parameter
// (an array of rows, each an array of the columns in the order the UsageAdd and ViolationAdd
// queries name); rows given twice are added up first, since one PostgreSQL statement cannot
// update a row twice.
func (s *Store) AddCounts(ctx context.Context, usage []control.UsageCount, violations []control.ViolationCount) error {
	type usageKey struct {
		minute       time.Time
		rule, tenant string
	}
	type violationKey struct {
		minute    time.Time
		rule, key string
	}
	usageRows := make([][]any, 0, len(usage))
	usageAt := map[usageKey]int{}
	var decisionRows [][]any // the DecisionRule rows, to decision_minutes
	for _, u := range usage {
		if err := u.Validate(); err != nil {
			return fmt.Errorf("add counts: %w", err)
		}
		m, err := minute(u.Minute)
		if err != nil {
			return fmt.Errorf("add counts: %w", err)
		}
		k := usageKey{m, u.Rule, u.Tenant}
		if i, ok := usageAt[k]; ok {
			r := usageRows[i]
			if u.Rule == control.DecisionRule {
				r = decisionRows[i]
			}
			n := len(r)
			r[n-3], r[n-2], r[n-1] = r[n-3].(int64)+u.Allowed, r[n-2].(int64)+u.Denied, r[n-1].(int64)+u.Soft
			continue
		}
		if u.Rule == control.DecisionRule {
			usageAt[k] = len(decisionRows)
			decisionRows = append(decisionRows, []any{s.d.Time(m), u.Tenant, u.Allowed, u.Denied, u.Soft})
			continue
		}
		usageAt[k] = len(usageRows)
		usageRows = append(usageRows, []any{s.d.Time(m), u.Rule, u.Tenant, u.Allowed, u.Denied, u.Soft})
	}
	violationRows := make([][]any, 0, len(violations))
	violationAt := map[violationKey]int{}
	for _, v := range violations {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("add counts: %w", err)
		}
		m, err := minute(v.Minute)
		if err != nil {
			return fmt.Errorf("add counts: %w", err)
		}
		k := violationKey{m, v.Rule, identityKey(v)}
		if i, ok := violationAt[k]; ok {
			r := violationRows[i]
			r[8], r[9], r[10] = r[8].(int64)+v.Denied, r[9].(int64)+v.Soft, v.Limit
			continue
		}
		violationAt[k] = len(violationRows)
		violationRows = append(violationRows, []any{s.d.Time(m), v.Rule, k.key, v.Tenant, v.User, v.APIKey, v.IP, v.Endpoint,
			v.Denied, v.Soft, v.Limit})
	}
	if len(usageRows) == 0 && len(violationRows) == 0 && len(decisionRows) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add counts: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := addChunks(ctx, tx, s.q["UsageAdd"], usageRows); err != nil {
		return fmt.Errorf("add usage counts: %w", s.mapErr(err))
	}
	if err := addChunks(ctx, tx, s.q["ViolationAdd"], violationRows); err != nil {
		return fmt.Errorf("add violation counts: %w", s.mapErr(err))
	}
	if err := addChunks(ctx, tx, s.q["DecisionAdd"], decisionRows); err != nil {
		return fmt.Errorf("add decision counts: %w", s.mapErr(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("add counts: commit: %w", err)
	}
	return nil
}

// addChunks runs query once per countsChunk rows, the rows as its one JSON parameter.
func addChunks(ctx context.Context, tx *sql.Tx, query string, rows [][]any) error {
	for len(rows) > 0 {
		n := min(len(rows), countsChunk)
		b, err := json.Marshal(rows[:n])
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, query, string(b)); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// UsageHistory implements control.Store.
func (s *Store) UsageHistory(ctx context.Context, f control.UsageFilter) ([]control.UsagePoint, error) {
	if f.Step < time.Minute || f.Step > 24*time.Hour || f.Step%time.Minute != 0 {
		return nil, fmt.Errorf("usage history: %w", &control.InvalidError{Field: "step", Msg: "a whole number of minutes, at most a day"})
	}
	from, to := clampTime(f.From), f.To
	if to.IsZero() {
		to = maxTime
	}
	scan := func(r *sql.Rows) (control.UsagePoint, error) {
		var p control.UsagePoint
		err := r.Scan(ts{&p.At}, &p.Allowed, &p.Denied, &p.Soft)
		return p, err
	}
	var out []control.UsagePoint
	var err error
	if f.Rule == control.DecisionRule {
		out, err = list(ctx, s.db, s.q["DecisionHistory"], scan, f.Tenant, s.d.Time(from), s.d.Time(clampTime(to)), f.Step.Microseconds())
	} else {
		out, err = list(ctx, s.db, s.q["UsageHistory"], scan, f.Rule, f.Tenant, s.d.Time(from), s.d.Time(clampTime(to)), f.Step.Microseconds())
	}
	if err != nil {
		return nil, fmt.Errorf("usage history: %w", err)
	}
	return out, nil
}

// Violations implements control.Store.
func (s *Store) Violations(ctx context.Context, f control.ViolationFilter) ([]control.ViolationCount, error) {
	until := f.Until
	if until.IsZero() {
		until = maxTime
	}
	limit := f.Limit
	switch {
	case limit <= 0:
		limit = control.DefaultAuditLimit
	case limit > control.MaxAuditLimit:
		limit = control.MaxAuditLimit
	}
	out, err := list(ctx, s.db, s.q["ViolationList"], func(r *sql.Rows) (control.ViolationCount, error) {
		var v control.ViolationCount
		err := r.Scan(ts{&v.Minute}, &v.Rule, &v.Tenant, &v.User, &v.APIKey, &v.IP, &v.Endpoint, &v.Denied, &v.Soft, &v.Limit)
		return v, err
	}, f.Tenant, f.User, f.APIKey, f.IP, f.Rule, s.d.Time(clampTime(f.Since)), s.d.Time(clampTime(until)), int64(limit))
	if err != nil {
		return nil, fmt.Errorf("violations: %w", err)
	}
	return out, nil
}

// PruneCounts implements control.Store.
func (s *Store) PruneCounts(ctx context.Context, before time.Time) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("prune counts: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var n int64
	for _, q := range []string{"UsagePrune", "ViolationPrune", "DecisionPrune"} {
		res, err := tx.ExecContext(ctx, s.q[q], s.d.Time(clampTime(before)))
		if err != nil {
			return 0, fmt.Errorf("prune counts: %w", err)
		}
		m, _ := res.RowsAffected()
		n += m
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("prune counts: commit: %w", err)
	}
	return n, nil
}

// WindowTotals implements control.Store.
func (s *Store) WindowTotals(ctx context.Context, from, to time.Time) ([]control.UsageCount, []control.ViolationCount, error) {
	at := clampTime(from).UTC().Truncate(time.Microsecond)
	tx, err := s.db.BeginTx(ctx, s.d.ReadTx)
	if err != nil {
		return nil, nil, fmt.Errorf("window totals: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	args := []any{s.d.Time(clampTime(from)), s.d.Time(clampTime(to))}
	usage, err := list(ctx, tx, s.q["UsageTotals"], func(r *sql.Rows) (control.UsageCount, error) {
		u := control.UsageCount{Minute: at}
		err := r.Scan(&u.Rule, &u.Tenant, &u.Allowed, &u.Denied, &u.Soft)
		return u, err
	}, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("window totals: usage: %w", err)
	}
	viols, err := list(ctx, tx, s.q["ViolationTotalsNoTenant"], func(r *sql.Rows) (control.ViolationCount, error) {
		v := control.ViolationCount{Minute: at}
		err := r.Scan(&v.Rule, &v.User, &v.APIKey, &v.IP, &v.Denied, &v.Soft)
		return v, err
	}, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("window totals: violations: %w", err)
	}
	// Sorted here rather than in SQL: PostgreSQL's collation and SQLite's byte order differ.
	slices.SortFunc(usage, func(a, b control.UsageCount) int {
		return cmp.Or(strings.Compare(a.Rule, b.Rule), strings.Compare(a.Tenant, b.Tenant))
	})
	slices.SortFunc(viols, func(a, b control.ViolationCount) int {
		return cmp.Or(strings.Compare(a.Rule, b.Rule), strings.Compare(a.User, b.User),
			strings.Compare(a.APIKey, b.APIKey), strings.Compare(a.IP, b.IP))
	})
	return usage, viols, nil
}

// AcquireLease implements control.Store.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if err := control.CheckName("name", name); err != nil {
		return false, fmt.Errorf("acquire lease: %w", err)
	}
	if err := control.CheckText("holder", holder, 1, control.MaxActorLen); err != nil {
		return false, fmt.Errorf("acquire lease: %w", err)
	}
	if ttl <= 0 {
		return false, fmt.Errorf("acquire lease: %w", &control.InvalidError{Field: "ttl", Msg: "must be > 0"})
	}
	now := s.clock()
	var got string
	err := s.db.QueryRowContext(ctx, s.q["LeaseAcquire"], name, holder, s.d.Time(clampTime(now.Add(ttl))), s.d.Time(now)).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("acquire lease %q: %w", name, s.mapErr(err))
	}
	return got == holder, nil
}

// Lease implements control.Store.
func (s *Store) Lease(ctx context.Context, name string) (string, time.Time, error) {
	type lease struct {
		holder string
		until  time.Time
	}
	l, err := one(ctx, s.db, s.q["LeaseGet"], func(r *sql.Rows) (lease, error) {
		var l lease
		err := r.Scan(&l.holder, ts{&l.until})
		return l, err
	}, name)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("lease %q: %w", name, err)
	}
	return l.holder, l.until, nil
}

// ReleaseLease implements control.Store.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if _, err := s.db.ExecContext(ctx, s.q["LeaseRelease"], name, holder); err != nil {
		return fmt.Errorf("release lease %q: %w", name, err)
	}
	return nil
}
