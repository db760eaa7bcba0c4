-- 0003: escalation (docs/architecture.md, Control plane): the warn override, escalation's first
-- penalty for a burst, and the audit actions that record escalation's penalties. The SQLite
-- twin is control/sqlite/sql/migrations/0003_escalation.sql.

ALTER TABLE overrides DROP CONSTRAINT overrides_type_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_type_check
    CHECK (type IN ('ban', 'multiplier', 'custom', 'warn'));

ALTER TABLE audit_events DROP CONSTRAINT audit_events_action_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_action_check
    CHECK (action IN ('create', 'update', 'delete', 'expire', 'burst_detected_warning', 'burst_detected_blocked'));
