-- 0003: escalation (docs/architecture.md, Control plane): the warn override, escalation's first
-- penalty for a burst, and the audit actions that record escalation's penalties; the SQLite
-- twin of control/postgres/sql/migrations/0003_escalation.sql. SQLite cannot change a CHECK
-- constraint in place, so both tables are rebuilt with their rows, ids and indexes as they
-- were, and each keeps its AUTOINCREMENT sequence: an id deleted before never comes back.

CREATE TABLE overrides_new (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    target_key  TEXT NOT NULL UNIQUE CHECK (length(target_key) = 64),
    tenant      TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    user_name   TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    api_key     TEXT NOT NULL DEFAULT '' CHECK (length(api_key) <= 512),
    endpoint    TEXT NOT NULL DEFAULT '' CHECK (length(endpoint) <= 512),
    rule_name   TEXT NOT NULL DEFAULT '' CHECK (length(rule_name) <= 128),
    type        TEXT NOT NULL CHECK (type IN ('ban', 'multiplier', 'custom', 'warn')),
    value       REAL NOT NULL DEFAULT 0 CHECK (value >= 0 AND value < 9e999),
    limit_value INTEGER NOT NULL DEFAULT 0 CHECK (limit_value >= 0),
    burst       INTEGER NOT NULL DEFAULT 0 CHECK (burst >= 0),
    expires_at  INTEGER NOT NULL,
    reason      TEXT NOT NULL CHECK (length(reason) <= 1024),
    source      TEXT NOT NULL CHECK (source IN ('api', 'automatic')),
    created_by  TEXT NOT NULL CHECK (length(created_by) BETWEEN 1 AND 256),
    created_at  INTEGER NOT NULL,
    version     INTEGER NOT NULL CHECK (version > 0),
    CHECK (tenant <> '' OR user_name <> '' OR api_key <> '' OR endpoint <> ''),
    CHECK (type <> 'multiplier' OR value > 0)
) STRICT;
INSERT INTO overrides_new SELECT id, target_key, tenant, user_name, api_key, endpoint, rule_name, type,
    value, limit_value, burst, expires_at, reason, source, created_by, created_at, version FROM overrides;
DELETE FROM sqlite_sequence WHERE name = 'overrides_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'overrides_new', seq FROM sqlite_sequence WHERE name = 'overrides';
DROP TABLE overrides;
ALTER TABLE overrides_new RENAME TO overrides;
CREATE INDEX overrides_expires_at ON overrides (expires_at);

CREATE TABLE audit_events_new (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    action  TEXT NOT NULL CHECK (action IN ('create', 'update', 'delete', 'expire', 'burst_detected_warning', 'burst_detected_blocked')),
    kind    TEXT NOT NULL CHECK (kind IN ('rule', 'override', 'exemption', 'identity', 'token', 'policy_files', 'penalty')),
    target  TEXT NOT NULL CHECK (length(target) <= 1024),
    before  TEXT,
    after   TEXT,
    reason  TEXT NOT NULL CHECK (length(reason) <= 1024),
    version INTEGER NOT NULL CHECK (version >= 0)
) STRICT;
INSERT INTO audit_events_new SELECT id, at, actor, action, kind, target, before, after, reason, version FROM audit_events;
DELETE FROM sqlite_sequence WHERE name = 'audit_events_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'audit_events_new', seq FROM sqlite_sequence WHERE name = 'audit_events';
DROP TABLE audit_events;
ALTER TABLE audit_events_new RENAME TO audit_events;
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_actor ON audit_events (actor, id);
CREATE INDEX audit_events_kind ON audit_events (kind, id);
CREATE INDEX audit_events_target ON audit_events (target);
