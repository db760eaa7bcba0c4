package sqlstore

import (
	"context"
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
