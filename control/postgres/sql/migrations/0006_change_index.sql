-- 0006: indexes on the control version of overrides, identity assignments and audit events, so
-- that a node reads only what changed since the version it holds (control.ChangeReader,
-- docs/architecture.md, Changes in proportion to their size) rather than every row.

CREATE INDEX overrides_version ON overrides (version);
CREATE INDEX identities_version ON identities (version);
CREATE INDEX audit_events_version ON audit_events (version);
