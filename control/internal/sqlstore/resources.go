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
	"time"

	"github.com/sluicehq/sluice/control"
)

// The control store's resources: rules, overrides, exemptions and identity assignments.

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

func scanOverride(r *sql.Rows) (control.Override, error) {
	var o control.Override
	var typ, src string
	err := r.Scan(&o.ID, &o.Tenant, &o.User, &o.APIKey, &o.Endpoint, &o.Rule, &typ, &o.Value, &o.Limit, &o.Burst,
		ts{&o.ExpiresAt}, &o.Reason, &src, &o.CreatedBy, ts{&o.CreatedAt}, &o.Version, &o.IP, &o.APIKeyHash)
	o.Type, o.Source = control.OverrideType(typ), control.Source(src)
	return o, err
}

// targetKey is the unique key of an override's target: a hash, since the tuple can be longer
// than an index entry. JSON encoding keeps ("a:b","c") and ("a","b:c") apart.
func targetKey(o control.Override) string {
	b, _ := json.Marshal(o.TargetTuple())
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ListOverrides implements control.Store.
func (s *Store) ListOverrides(ctx context.Context, f control.OverrideFilter) ([]control.Override, error) {
	out, err := list(ctx, s.db, s.q["OverrideListActive"], scanOverride,
		s.d.Time(s.clock()), f.Tenant, f.User, f.APIKey, string(f.Source), f.AfterID, pageLimit(f.Limit))
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
			o.CreatedBy, s.d.Time(o.CreatedAt), o.Version, o.IP, o.APIKeyHash).Scan(&o.ID); err != nil {
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

// pageLimit is the LIMIT of a list query: n, or every row when n <= 0 (both databases take
// the largest int64 as no limit).
func pageLimit(n int) int64 {
	if n <= 0 {
		return math.MaxInt64
	}
	return int64(n)
}
