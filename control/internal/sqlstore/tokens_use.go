package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/control"
)

// normTokenExpiry puts a token's expiry in the stored form and checks its range.
func normTokenExpiry(tok *control.Token) error {
	if tok.ExpiresAt == nil {
		return nil
	}
	at := tok.ExpiresAt.UTC().Truncate(time.Microsecond)
	if err := checkTime("expires_at", at); err != nil {
		return err
	}
	tok.ExpiresAt = &at
	return nil
}

// tokenExpiry is the expires_at parameter of a token: NULL for none.
func (s *Store) tokenExpiry(tok control.Token) any {
	if tok.ExpiresAt == nil {
		return nil
	}
	return s.d.Time(*tok.ExpiresAt)
}

// TokenUsed implements control.Store.
func (s *Store) TokenUsed(ctx context.Context, name string, at time.Time) error {
	at = at.UTC().Truncate(time.Microsecond)
	if err := checkTime("last_used_at", at); err != nil {
		return fmt.Errorf("token %q used: %w", name, err)
	}
	if _, err := s.db.ExecContext(ctx, s.q["TokenUsed"], name, s.d.Time(at)); err != nil {
		return fmt.Errorf("token %q used: %w", name, s.mapErr(err))
	}
	return nil
}

// TokenRevoked implements control.Store.
func (s *Store) TokenRevoked(ctx context.Context, h control.TokenHash) (bool, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q["TokenRevokedGet"], h[:]).Scan(&n); err != nil {
		return false, fmt.Errorf("token revoked: %w", s.mapErr(err))
	}
	return n > 0, nil
}
