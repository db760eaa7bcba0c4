-- 0010: overrides may name an API key by its hash and an IP address or CIDR (issue 27: the
-- abuse detector penalizes the callers it sees, and it sees API keys only hashed); the SQLite
-- twin of control/postgres/sql/migrations/0010_identity_overrides.sql. SQLite cannot change
-- a CHECK constraint in place, so the table is rebuilt with its rows, ids and indexes as they
-- were, and keeps its AUTOINCREMENT sequence: an id deleted before never comes back.

CREATE TABLE overrides_new (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    target_key   TEXT NOT NULL UNIQUE CHECK (length(target_key) = 64),
    tenant       TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    user_name    TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    api_key      TEXT NOT NULL DEFAULT '' CHECK (length(api_key) <= 512),
    endpoint     TEXT NOT NULL DEFAULT '' CHECK (length(endpoint) <= 512),
    rule_name    TEXT NOT NULL DEFAULT '' CHECK (length(rule_name) <= 128),
    type         TEXT NOT NULL CHECK (type IN ('ban', 'multiplier', 'custom', 'warn')),
    value        REAL NOT NULL DEFAULT 0 CHECK (value >= 0 AND value < 9e999),
    limit_value  INTEGER NOT NULL DEFAULT 0 CHECK (limit_value >= 0),
    burst        INTEGER NOT NULL DEFAULT 0 CHECK (burst >= 0),
    expires_at   INTEGER NOT NULL,
    reason       TEXT NOT NULL CHECK (length(reason) <= 1024),
    source       TEXT NOT NULL CHECK (source IN ('api', 'automatic')),
    created_by   TEXT NOT NULL CHECK (length(created_by) BETWEEN 1 AND 256),
    created_at   INTEGER NOT NULL,
    version      INTEGER NOT NULL CHECK (version > 0),
    ip           TEXT NOT NULL DEFAULT '' CHECK (length(ip) <= 512),
    api_key_hash TEXT NOT NULL DEFAULT '' CHECK (api_key_hash = '' OR length(api_key_hash) = 33),
    CHECK (tenant <> '' OR user_name <> '' OR api_key <> '' OR endpoint <> '' OR ip <> '' OR api_key_hash <> ''),
    CHECK (type <> 'multiplier' OR value > 0)
) STRICT;
INSERT INTO overrides_new SELECT id, target_key, tenant, user_name, api_key, endpoint, rule_name, type,
    value, limit_value, burst, expires_at, reason, source, created_by, created_at, version, '', '' FROM overrides;
DELETE FROM sqlite_sequence WHERE name = 'overrides_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'overrides_new', seq FROM sqlite_sequence WHERE name = 'overrides';
DROP TABLE overrides;
ALTER TABLE overrides_new RENAME TO overrides;
CREATE INDEX overrides_expires_at ON overrides (expires_at);
CREATE INDEX overrides_version ON overrides (version);
