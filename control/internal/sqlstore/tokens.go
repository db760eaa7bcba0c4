package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/control"
)

func scanToken(r *sql.Rows) (control.Token, error) {
	var t control.Token
	var role string
	var hash []byte
	if err := r.Scan(&t.Name, &role, &hash, &t.CreatedBy, ts{&t.CreatedAt}, &t.Version, nullTS{&t.ExpiresAt}, nullTS{&t.LastUsedAt}); err != nil {
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
	if err := normTokenExpiry(&tok); err != nil {
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
		tok.CreatedBy, tok.CreatedAt, tok.Version, tok.LastUsedAt = ch.Actor, t.now, t.version, nil
		if _, err := t.tx.ExecContext(ctx, s.q["TokenInsert"], tok.Name, string(tok.Role), tok.Hash[:],
			tok.CreatedBy, s.d.Time(tok.CreatedAt), tok.Version, s.tokenExpiry(tok)); err != nil {
			return err // a taken hash is a unique violation: ErrConflict
		}
		return t.audit(control.KindToken, control.ActionCreate, tok.Name, nil, tok, "")
	})
	if err != nil {
		return control.Token{}, fmt.Errorf("create token %q: %w", tok.Name, err)
	}
	return tok, nil
}

// ReplaceToken implements control.Store.
func (s *Store) ReplaceToken(ctx context.Context, ch control.Change, tok control.Token) (control.Token, error) {
	if err := tok.Validate(); err != nil {
		return control.Token{}, fmt.Errorf("replace token: %w", err)
	}
	if err := normTokenExpiry(&tok); err != nil {
		return control.Token{}, fmt.Errorf("replace token: %w", err)
	}
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["TokenGet"], scanToken, tok.Name)
		exists := err == nil
		if err != nil && !errors.Is(err, control.ErrNotFound) {
			return err
		}
		if exists {
			if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
				return err
			}
			if _, err := t.tx.ExecContext(ctx, s.q["TokenDelete"], tok.Name); err != nil {
				return err
			}
		} else if ch.IfMatch != "" {
			return control.ErrPreconditionFailed
		}
		tok.CreatedBy, tok.CreatedAt, tok.Version, tok.LastUsedAt = ch.Actor, t.now, t.version, nil
		if _, err := t.tx.ExecContext(ctx, s.q["TokenInsert"], tok.Name, string(tok.Role), tok.Hash[:],
			tok.CreatedBy, s.d.Time(tok.CreatedAt), tok.Version, s.tokenExpiry(tok)); err != nil {
			return err // a taken hash is a unique violation: ErrConflict
		}
		if !exists {
			return t.audit(control.KindToken, control.ActionCreate, tok.Name, nil, tok, "")
		}
		return t.audit(control.KindToken, control.ActionUpdate, tok.Name, old, tok, "")
	})
	if err != nil {
		return control.Token{}, fmt.Errorf("replace token %q: %w", tok.Name, err)
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
		if old.Role == control.RoleAdmin {
			// Inside the transaction, after the version bump that serializes writers: two
			// admins deleting each other's tokens at once cannot both pass.
			toks, err := list(ctx, t.tx, s.q["TokenList"], scanToken)
			if err != nil {
				return err
			}
			admins := 0
			for _, tk := range toks {
				if tk.Role == control.RoleAdmin {
					admins++
				}
			}
			if admins <= 1 {
				return control.ErrLastAdmin
			}
		}
		if _, err := t.tx.ExecContext(ctx, s.q["TokenDelete"], name); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["TokenRevokedInsert"], old.Hash[:], name, s.d.Time(t.now)); err != nil {
			return err
		}
		return t.audit(control.KindToken, control.ActionDelete, name, old, nil, "")
	})
	if err != nil {
		return 0, fmt.Errorf("delete token %q: %w", name, err)
	}
	return v, nil
}

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
