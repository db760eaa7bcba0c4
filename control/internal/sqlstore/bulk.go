package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/control"
)

var _ control.Importer = (*Store)(nil)

// errUnchanged rolls back an import that would change nothing, or a dry run, so the version
// does not move.
var errUnchanged = errors.New("nothing to import")

// Import implements control.Importer: one transaction, one control version, an audit event
// per resource created or changed. What is stored is read once up front (rules, active
// overrides and exemptions, identities, domains) rather than per entry, so an entry costs
// its write and its audit event.
func (s *Store) Import(ctx context.Context, ch control.Change, b *control.Bundle, apply bool) (control.ImportResult, error) {
	var res control.ImportResult
	for i := range b.Overrides {
		b.Overrides[i].ExpiresAt = b.Overrides[i].ExpiresAt.UTC().Truncate(time.Microsecond)
		if err := checkTime("expires_at", b.Overrides[i].ExpiresAt); err != nil {
			return res, fmt.Errorf("import: overrides[%d]: %w", i, err)
		}
	}
	for i := range b.Exemptions {
		if e := b.Exemptions[i].ExpiresAt; e != nil {
			t := e.UTC().Truncate(time.Microsecond)
			b.Exemptions[i].ExpiresAt = &t
		}
	}
	if err := b.Validate(); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	v, err := s.change(ctx, ch, func(t *tx) error {
		res = control.ImportResult{}
		bt := &bulkTx{tx: t, stmts: map[string]*sql.Stmt{}}
		defer bt.close()
		if err := s.importRules(bt, b, &res); err != nil {
			return err
		}
		if err := s.importDomains(bt, b, &res); err != nil {
			return err
		}
		if err := s.importOverrides(bt, b, &res); err != nil {
			return err
		}
		if err := s.importExemptions(bt, b, &res); err != nil {
			return err
		}
		if err := s.importIdentities(bt, b, &res); err != nil {
			return err
		}
		if res.Created+res.Updated == 0 || !apply {
			return errUnchanged
		}
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return res, nil
	}
	if err != nil {
		return control.ImportResult{}, fmt.Errorf("import: %w", err)
	}
	res.Version = v
	return res, nil
}

// note counts one entry created or updated.
func note(r *control.ImportResult, action control.Action, kind control.Kind, key string) {
	if action == control.ActionCreate {
		r.Created++
	} else {
		r.Updated++
	}
	r.Changes = append(r.Changes, control.ImportChange{Action: action, Kind: kind, Key: key})
}

// overrideKey names an override's target as "tenant=a,user=b" with the fields it sets.
func overrideKey(o control.Override) string {
	return joinSet("tenant", o.Tenant, "user", o.User, "api_key", o.APIKey, "api_key_hash", o.APIKeyHash, "ip", o.IP,
		"endpoint", o.Endpoint, "rule", o.Rule)
}

// exemptionKey names the caller an exemption names.
func exemptionKey(e control.Exemption) string {
	return joinSet("api_key", e.APIKey, "user", e.User, "tenant", e.Tenant, "ip", e.IP)
}

func joinSet(kv ...string) string {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "" {
			continue
		}
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = append(b, kv[i]...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, kv[i+1])
	}
	return string(b)
}

func (s *Store) importRules(bt *bulkTx, b *control.Bundle, res *control.ImportResult) error {
	t := bt.tx
	if len(b.Rules) == 0 {
		return nil
	}
	stored, err := list(t.ctx, t.tx, s.q["RuleList"], scanRule)
	if err != nil {
		return err
	}
	byName := make(map[string]control.Rule, len(stored))
	for _, r := range stored {
		byName[r.Name] = r
	}
	for _, r := range b.Rules {
		old, exists := byName[r.Name]
		switch {
		case exists && bytes.Equal(old.Body, r.Body):
			res.Unchanged++
		case exists:
			if _, err := bt.exec("RuleUpdate", r.Name, string(r.Body), s.d.Time(t.now), t.ch.Actor, t.version); err != nil {
				return err
			}
			note(res, control.ActionUpdate, control.KindRule, r.Name)
			if err := bt.audit(control.KindRule, control.ActionUpdate, r.Name, old.Body, r.Body, ""); err != nil {
				return err
			}
		default:
			if _, err := bt.exec("RuleInsert", r.Name, string(r.Body), s.d.Time(t.now), t.ch.Actor, t.version); err != nil {
				return err
			}
			note(res, control.ActionCreate, control.KindRule, r.Name)
			if err := bt.audit(control.KindRule, control.ActionCreate, r.Name, nil, r.Body, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) importDomains(bt *bulkTx, b *control.Bundle, res *control.ImportResult) error {
	t := bt.tx
	if len(b.Domains) == 0 {
		return nil
	}
	stored, err := list(t.ctx, t.tx, s.q["DomainList"], scanDomain)
	if err != nil {
		return err
	}
	byName := make(map[string]control.Domain, len(stored))
	for _, d := range stored {
		byName[d.Name] = d
	}
	for _, d := range b.Domains {
		old, exists := byName[d.Name]
		switch {
		case exists && bytes.Equal(old.Body, d.Body):
			res.Unchanged++
		case exists:
			if _, err := bt.exec("DomainUpdate", d.Name, string(d.Body), s.d.Time(t.now), t.ch.Actor, t.version); err != nil {
				return err
			}
			note(res, control.ActionUpdate, control.KindDomain, d.Name)
			if err := bt.audit(control.KindDomain, control.ActionUpdate, d.Name, old.Body, d.Body, ""); err != nil {
				return err
			}
		default:
			if _, err := bt.exec("DomainInsert", d.Name, string(d.Body), s.d.Time(t.now), t.ch.Actor, t.version); err != nil {
				return err
			}
			note(res, control.ActionCreate, control.KindDomain, d.Name)
			if err := bt.audit(control.KindDomain, control.ActionCreate, d.Name, nil, d.Body, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameOverride reports whether a and b differ only in what the store assigns.
func sameOverride(a, b control.Override) bool {
	if !a.ExpiresAt.Equal(b.ExpiresAt) {
		return false
	}
	for _, o := range []*control.Override{&a, &b} {
		o.ID, o.CreatedBy, o.CreatedAt, o.Version, o.ExpiresAt = 0, "", time.Time{}, 0, time.Time{}
	}
	return a == b
}

func (s *Store) importOverrides(bt *bulkTx, b *control.Bundle, res *control.ImportResult) error {
	t := bt.tx
	if len(b.Overrides) == 0 {
		return nil
	}
	// Every override, expired ones too: a target's expired override is collected here, as
	// CreateOverride collects it, or it would block its successor.
	active, err := list(t.ctx, t.tx, s.q["OverrideListActive"], scanOverride, s.d.Time(time.Unix(0, 0)), "", "", "", "", int64(0), pageLimit(0))
	if err != nil {
		return err
	}
	byTarget := make(map[string]control.Override, len(active))
	for _, o := range active {
		byTarget[targetKey(o)] = o
	}
	for i, o := range b.Overrides {
		if !o.ExpiresAt.After(t.now) {
			return &control.InvalidError{Field: fmt.Sprintf("overrides[%d].expires_at", i), Msg: "must be in the future"}
		}
		key := targetKey(o)
		old, exists := byTarget[key]
		live := exists && old.ExpiresAt.After(t.now)
		if live && sameOverride(old, o) {
			res.Unchanged++
			continue
		}
		var before any
		if exists {
			if !live {
				if err := t.expireOverride(old); err != nil {
					return err
				}
			} else {
				if _, err := bt.exec("OverrideDelete", old.ID); err != nil {
					return err
				}
				before = old
			}
		}
		o.CreatedBy, o.CreatedAt, o.Version = t.ch.Actor, t.now, t.version
		if err := bt.queryRow("OverrideInsert", key, o.Tenant, o.User, o.APIKey, o.Endpoint, o.Rule,
			string(o.Type), o.Value, o.Limit, o.Burst, s.d.Time(o.ExpiresAt), o.Reason, string(o.Source),
			o.CreatedBy, s.d.Time(o.CreatedAt), o.Version, o.IP, o.APIKeyHash).Scan(&o.ID); err != nil {
			return err
		}
		action := control.ActionCreate
		if before != nil {
			action = control.ActionUpdate
		}
		note(res, action, control.KindOverride, overrideKey(o))
		if err := bt.audit(control.KindOverride, action, strconv.FormatInt(o.ID, 10), before, o, o.Reason); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) importExemptions(bt *bulkTx, b *control.Bundle, res *control.ImportResult) error {
	t := bt.tx
	for i, e := range b.Exemptions {
		if !active(e, t.now) {
			return &control.InvalidError{Field: fmt.Sprintf("exemptions[%d].expires_at", i), Msg: "must be in the future"}
		}
		old, err := one(t.ctx, t.tx, s.q["ExemptionGetByTarget"], scanExemption, e.APIKey, e.User, e.Tenant, e.IP)
		switch {
		case err == nil && active(old, t.now):
			res.Unchanged++ // the caller is exempt already
			continue
		case err == nil:
			if err := t.expireExemption(old); err != nil {
				return err
			}
		case !errors.Is(err, control.ErrNotFound):
			return err
		}
		var expires any
		if e.ExpiresAt != nil {
			expires = s.d.Time(*e.ExpiresAt)
		}
		e.CreatedBy, e.CreatedAt, e.Version = t.ch.Actor, t.now, t.version
		if err := bt.queryRow("ExemptionInsert", e.APIKey, e.User, e.Tenant, e.IP, e.Reason, expires,
			e.CreatedBy, s.d.Time(e.CreatedAt), e.Version).Scan(&e.ID); err != nil {
			return err
		}
		note(res, control.ActionCreate, control.KindExemption, exemptionKey(e))
		if err := bt.audit(control.KindExemption, control.ActionCreate, strconv.FormatInt(e.ID, 10), nil, e, e.Reason); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) importIdentities(bt *bulkTx, b *control.Bundle, res *control.ImportResult) error {
	t := bt.tx
	if len(b.Identities) == 0 {
		return nil
	}
	stored, err := list(t.ctx, t.tx, s.q["IdentityList"], scanIdentity, "")
	if err != nil {
		return err
	}
	byRef := make(map[control.IdentityRef]control.Identity, len(stored))
	for _, id := range stored {
		byRef[control.IdentityRef{Kind: id.Kind, Value: id.Value}] = id
	}
	same := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	for _, id := range b.Identities {
		old, exists := byRef[control.IdentityRef{Kind: id.Kind, Value: id.Value}]
		if exists && old.Tier == id.Tier && old.Tenant == id.Tenant && old.User == id.User && same(old.Trust, id.Trust) {
			res.Unchanged++
			continue
		}
		id.UpdatedBy, id.UpdatedAt, id.Version = t.ch.Actor, t.now, t.version
		var trust any
		if id.Trust != nil {
			trust = *id.Trust
		}
		q, action, before := s.q["IdentityUpdate"], control.ActionUpdate, any(old)
		if !exists {
			q, action, before = s.q["IdentityInsert"], control.ActionCreate, nil
		}
		note(res, action, control.KindIdentity, identityTarget(id.Kind, id.Value))
		if _, err := t.tx.ExecContext(t.ctx, q, string(id.Kind), id.Value, id.Tier, id.Tenant, id.User, trust,
			id.UpdatedBy, s.d.Time(id.UpdatedAt), id.Version); err != nil {
			return err
		}
		if err := bt.audit(control.KindIdentity, action, identityTarget(id.Kind, id.Value), before, id, ""); err != nil {
			return err
		}
	}
	return nil
}

// bulkTx runs an import's statements prepared once each: an import runs the same few
// statements a hundred thousand times, and a statement prepared again for each costs the
// embedded store most of its time.
type bulkTx struct {
	tx    *tx
	stmts map[string]*sql.Stmt
}

func (bt *bulkTx) stmt(name string) (*sql.Stmt, error) {
	if st, ok := bt.stmts[name]; ok {
		return st, nil
	}
	st, err := bt.tx.tx.PrepareContext(bt.tx.ctx, bt.tx.s.q[name])
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", name, err)
	}
	bt.stmts[name] = st
	return st, nil
}

func (bt *bulkTx) exec(name string, args ...any) (sql.Result, error) {
	st, err := bt.stmt(name)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(bt.tx.ctx, args...)
}

// row is the one row of a prepared query, or the error that kept it from running.
type row struct {
	r   *sql.Row
	err error
}

func (r row) Scan(dst ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.r.Scan(dst...)
}

func (bt *bulkTx) queryRow(name string, args ...any) row {
	st, err := bt.stmt(name)
	if err != nil {
		return row{err: err}
	}
	return row{r: st.QueryRowContext(bt.tx.ctx, args...)}
}

// audit is tx.audit through the prepared statement.
func (bt *bulkTx) audit(kind control.Kind, action control.Action, target string, before, after any, reason string) error {
	args, err := bt.tx.auditArgs(kind, action, target, before, after, reason)
	if err != nil {
		return err
	}
	var id int64
	return bt.queryRow("AuditInsert", args...).Scan(&id)
}

func (bt *bulkTx) close() {
	for _, st := range bt.stmts {
		st.Close()
	}
}
