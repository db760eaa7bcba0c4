package sqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluicehq/sluice/control"
)

// PageExemptions implements control.Pager.
func (s *Store) PageExemptions(ctx context.Context, p control.Page) ([]control.Exemption, error) {
	out, err := list(ctx, s.db, s.q["ExemptionPage"], scanExemption, s.d.Time(s.clock()), p.AfterID, pageLimit(p.Limit))
	if err != nil {
		return nil, fmt.Errorf("list exemptions: %w", err)
	}
	return out, nil
}

// PageIdentities implements control.Pager.
func (s *Store) PageIdentities(ctx context.Context, kind control.IdentityKind, p control.Page) ([]control.Identity, error) {
	out, err := list(ctx, s.db, s.q["IdentityPage"], scanIdentity, string(kind), string(p.AfterKind), p.AfterName, pageLimit(p.Limit))
	if err != nil {
		return nil, fmt.Errorf("list identities: %w", err)
	}
	return out, nil
}

// PageRules implements control.Pager.
func (s *Store) PageRules(ctx context.Context, p control.Page) ([]control.Rule, error) {
	out, err := list(ctx, s.db, s.q["RulePage"], scanRule, p.AfterName, pageLimit(p.Limit))
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	return out, nil
}

// PageTokens implements control.Pager.
func (s *Store) PageTokens(ctx context.Context, p control.Page) ([]control.Token, error) {
	out, err := list(ctx, s.db, s.q["TokenPage"], scanToken, p.AfterName, pageLimit(p.Limit))
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return out, nil
}

// PageDomains implements control.Pager.
func (s *Store) PageDomains(ctx context.Context, p control.Page) ([]control.Domain, error) {
	out, err := list(ctx, s.db, s.q["DomainPage"], scanDomain, p.AfterName, pageLimit(p.Limit))
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	return out, nil
}

// PageViolations implements control.ViolationPager.
func (s *Store) PageViolations(ctx context.Context, f control.ViolationFilter, after *control.ViolationKey, limit int) ([]control.PagedViolation, error) {
	until := f.Until
	if until.IsZero() {
		until = maxTime
	}
	if limit <= 0 {
		limit = control.DefaultAuditLimit
	}
	at, rule, key := until, "", ""
	if after != nil {
		at, rule, key = after.Minute, after.Rule, after.Identity
	}
	out, err := list(ctx, s.db, s.q["ViolationPage"], func(r *sql.Rows) (control.PagedViolation, error) {
		var v control.PagedViolation
		err := r.Scan(ts{&v.Minute}, &v.Rule, &v.Key.Identity, &v.Tenant, &v.User, &v.APIKey, &v.IP, &v.Endpoint, &v.Denied, &v.Soft, &v.Limit)
		v.Key.Minute, v.Key.Rule = v.Minute, v.Rule
		return v, err
	}, f.Tenant, f.User, f.APIKey, f.IP, f.Rule, s.d.Time(clampTime(f.Since)), s.d.Time(clampTime(until)),
		s.d.Time(clampTime(at)), rule, key, int64(limit))
	if err != nil {
		return nil, fmt.Errorf("violations: %w", err)
	}
	return out, nil
}
