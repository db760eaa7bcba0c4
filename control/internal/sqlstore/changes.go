package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/control"
)

var _ control.ChangeReader = (*Store)(nil)

// auditRow is what Changes reads of an audit event.
type auditRow struct {
	version      int64
	kind, target string
	before       sql.NullString
}

// Changes implements control.ChangeReader. Every change writes at least one audit event with
// its version in its own transaction, so the events after since name every resource that
// changed: overrides and identity assignments are read back by their version, and the ones
// gone are named by the events. Changes of any other kind, or fewer versions in the audit
// log than the version moved (pruned), make a Full delta.
func (s *Store) Changes(ctx context.Context, since int64) (*control.Delta, error) {
	tx, err := s.db.BeginTx(ctx, s.d.ReadTx)
	if err != nil {
		return nil, fmt.Errorf("changes: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	d := &control.Delta{Since: since, At: s.clock()}
	if err := tx.QueryRowContext(ctx, s.q["VersionGet"]).Scan(&d.Version); err != nil {
		return nil, fmt.Errorf("changes: version: %w", err)
	}
	switch {
	case d.Version == since:
		return d, nil
	case d.Version < since || d.Version-since > control.MaxDeltaVersions:
		d.Full = true
		return d, nil
	}
	events, err := list(ctx, tx, s.q["AuditSince"], func(r *sql.Rows) (auditRow, error) {
		var a auditRow
		err := r.Scan(&a.version, &a.kind, &a.target, &a.before)
		return a, err
	}, since)
	if err != nil {
		return nil, fmt.Errorf("changes: audit: %w", err)
	}
	versions := map[int64]bool{}
	for _, e := range events {
		versions[e.version] = true
		switch control.Kind(e.kind) {
		case control.KindToken:
		case control.KindOverride:
			if id, err := strconv.ParseInt(e.target, 10, 64); err == nil {
				d.RemovedOverrides = append(d.RemovedOverrides, id)
			}
			if e.before.Valid {
				// A replacement deletes the override it replaces, which its event names only
				// as its before.
				var old struct {
					ID int64 `json:"id"`
				}
				if json.Unmarshal([]byte(e.before.String), &old) == nil && old.ID > 0 {
					d.RemovedOverrides = append(d.RemovedOverrides, old.ID)
				}
			}
		case control.KindIdentity:
			kind, value, ok := strings.Cut(e.target, "/")
			if !ok {
				d.Full = true
				continue
			}
			d.RemovedIdentities = append(d.RemovedIdentities, control.IdentityRef{Kind: control.IdentityKind(kind), Value: value})
		default:
			d.Full = true
		}
	}
	if d.Full || int64(len(versions)) != d.Version-since {
		return &control.Delta{Since: since, Version: d.Version, At: d.At, Full: true}, nil
	}
	if d.Overrides, err = list(ctx, tx, s.q["OverrideListSince"], scanOverride, since); err != nil {
		return nil, fmt.Errorf("changes: overrides: %w", err)
	}
	if d.Identities, err = list(ctx, tx, s.q["IdentityListSince"], scanIdentity, since); err != nil {
		return nil, fmt.Errorf("changes: identities: %w", err)
	}
	return d, nil
}
