-- 0005: Envoy domains (docs/architecture.md, Envoy domains): domains in the reference service's
-- format created through the admin API, and their audit kind; the SQLite twin of
-- control/postgres/sql/migrations/0005_domains.sql. SQLite cannot change a CHECK constraint in
-- place, so audit_events is rebuilt with its rows, ids and indexes as they were, and keeps its
-- AUTOINCREMENT sequence: an id deleted before never comes back.

CREATE TABLE domains (
    name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    body       TEXT NOT NULL CHECK (length(CAST(body AS BLOB)) BETWEEN 2 AND 1048576),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    updated_by TEXT NOT NULL CHECK (length(updated_by) BETWEEN 1 AND 256),
    version    INTEGER NOT NULL CHECK (version > 0)
) STRICT;

CREATE TABLE audit_events_new (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    action  TEXT NOT NULL CHECK (action IN ('create', 'update', 'delete', 'expire', 'burst_detected_warning', 'burst_detected_blocked')),
    kind    TEXT NOT NULL CHECK (kind IN ('rule', 'override', 'exemption', 'identity', 'token', 'policy_files', 'penalty', 'domain')),
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
