package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/control"
)

// UpdateOverride implements control.Store: an UPDATE of the row in place, so no reader of the
// store (and no snapshot compiled from it) ever sees the target without its override.
func (s *Store) UpdateOverride(ctx context.Context, ch control.Change, o control.Override) (control.Override, error) {
	o.ExpiresAt = o.ExpiresAt.UTC().Truncate(time.Microsecond)
	if err := checkTime("expires_at", o.ExpiresAt); err != nil {
		return control.Override{}, fmt.Errorf("update override %d: %w", o.ID, err)
	}
	var out control.Override
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["OverrideGet"], scanOverride, o.ID)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if !o.ExpiresAt.After(t.now) {
			return &control.InvalidError{Field: "expires_at", Msg: "must be in the future"}
		}
		out = old
		out.Value, out.Limit, out.Burst, out.ExpiresAt, out.Reason = o.Value, o.Limit, o.Burst, o.ExpiresAt, o.Reason
		out.Version = t.version
		if err := out.Validate(); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["OverrideUpdate"], out.ID, out.Value, out.Limit, out.Burst,
			s.d.Time(out.ExpiresAt), out.Reason, out.Version); err != nil {
			return err
		}
		return t.audit(control.KindOverride, control.ActionUpdate, strconv.FormatInt(out.ID, 10), old, out, out.Reason)
	})
	if err != nil {
		return control.Override{}, fmt.Errorf("update override %d: %w", o.ID, err)
	}
	return out, nil
}

// UpdateExemption implements control.Store, as UpdateOverride does.
func (s *Store) UpdateExemption(ctx context.Context, ch control.Change, e control.Exemption) (control.Exemption, error) {
	var expires any
	if e.ExpiresAt != nil {
		at := e.ExpiresAt.UTC().Truncate(time.Microsecond)
		if err := checkTime("expires_at", at); err != nil {
			return control.Exemption{}, fmt.Errorf("update exemption %d: %w", e.ID, err)
		}
		e.ExpiresAt, expires = &at, s.d.Time(at)
	}
	var out control.Exemption
	_, err := s.change(ctx, ch, func(t *tx) error {
		old, err := one(ctx, t.tx, s.q["ExemptionGet"], scanExemption, e.ID)
		if err != nil {
			return s.missing(ch, err)
		}
		if err := ifMatch(ch.IfMatch, true, old.Version); err != nil {
			return err
		}
		if !active(e, t.now) {
			return &control.InvalidError{Field: "expires_at", Msg: "must be in the future"}
		}
		out = old
		out.ExpiresAt, out.Reason, out.Version = e.ExpiresAt, e.Reason, t.version
		if err := out.Validate(); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, s.q["ExemptionUpdate"], out.ID, out.Reason, expires, out.Version); err != nil {
			return err
		}
		return t.audit(control.KindExemption, control.ActionUpdate, strconv.FormatInt(out.ID, 10), old, out, out.Reason)
	})
	if err != nil {
		return control.Exemption{}, fmt.Errorf("update exemption %d: %w", e.ID, err)
	}
	return out, nil
}
