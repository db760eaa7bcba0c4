package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/control"
)

// Envoy-format domains created through the admin API: stored like rules, a name and a JSON body.

func scanDomain(r *sql.Rows) (control.Domain, error) {
	var d control.Domain
	var body string
	err := r.Scan(&d.Name, &body, ts{&d.CreatedAt}, ts{&d.UpdatedAt}, &d.UpdatedBy, &d.Version)
	d.Body = json.RawMessage(body)
	return d, err
}

// ListDomains implements control.Store.
func (s *Store) ListDomains(ctx context.Context) ([]control.Domain, error) {
	out, err := list(ctx, s.db, s.q["DomainList"], scanDomain)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	return out, nil
}

// GetDomain implements control.Store.
func (s *Store) GetDomain(ctx context.Context, name string) (control.Domain, error) {
	d, err := one(ctx, s.db, s.q["DomainGet"], scanDomain, name)
	if err != nil {
		return d, fmt.Errorf("get domain %q: %w", name, err)
	}
	return d, nil
}

// PutDomain implements control.Store.
func (s *Store) PutDomain(ctx context.Context, ch control.Change, name string, body json.RawMessage) (control.Domain, bool, error) {
	if err := control.ValidateDomain(name, body); err != nil {
		return control.Domain{}, false, fmt.Errorf("put domain: %w", err)
	}
	var out control.Domain
	var created bool
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["DomainGet"], scanDomain, name)
		exists := err == nil
		if err != nil && !errors.Is(err, control.ErrNotFound) {
			return err
		}
		if err := ifMatch(ch.IfMatch, exists, old.Version); err != nil {
			return err
		}
		created = !exists
		out = control.Domain{Name: name, Body: body, CreatedAt: t.now, UpdatedAt: t.now, UpdatedBy: ch.Actor, Version: t.version}
		if created {
			if _, err := t.tx.ExecContext(ctx, s.q["DomainInsert"], name, string(body), s.d.Time(t.now), ch.Actor, t.version); err != nil {
				return err
			}
			return t.audit(control.KindDomain, control.ActionCreate, name, nil, body, "")
		}
		out.CreatedAt = old.CreatedAt
		if _, err := t.tx.ExecContext(ctx, s.q["DomainUpdate"], name, string(body), s.d.Time(t.now), ch.Actor, t.version); err != nil {
			return err
		}
		return t.audit(control.KindDomain, control.ActionUpdate, name, old.Body, body, "")
	})
	if err != nil {
		return control.Domain{}, false, fmt.Errorf("put domain %q: %w", name, err)
	}
	return out, created, nil
}

// DeleteDomain implements control.Store.
func (s *Store) DeleteDomain(ctx context.Context, ch control.Change, name string) (int64, error) {
	v, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["DomainGet"], scanDomain, name)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["DomainDelete"], name); err != nil {
			return err
		}
		return t.audit(control.KindDomain, control.ActionDelete, name, old.Body, nil, "")
	})
	if err != nil {
		return 0, fmt.Errorf("delete domain %q: %w", name, err)
	}
	return v, nil
}
