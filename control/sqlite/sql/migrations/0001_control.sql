-- 0001: the control store (docs/architecture.md, Control plane); the SQLite twin of
-- control/postgres/sql/migrations/0001_control.sql, table for table. Times are INTEGER
-- microseconds since the Unix epoch (UTC); tables are STRICT, so a column holds only its type.
-- The limits mirror control/validate.go; they are here too so that no writer, buggy or not,
-- can store what Sluice cannot read back. length() counts characters, as char_length does.
-- Unset optional strings are '' (NOT NULL), so UNIQUE constraints treat them as values.

-- One row: the control version, bumped by every change in the change's own transaction.
-- Writers are serialized by BEGIN IMMEDIATE, which makes check-then-write in a change safe.
CREATE TABLE control_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL CHECK (version >= 0)
) STRICT;
INSERT INTO control_version (id, version) VALUES (1, 0);

CREATE TABLE rules (
    name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    body       TEXT NOT NULL CHECK (length(CAST(body AS BLOB)) BETWEEN 2 AND 65536),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    updated_by TEXT NOT NULL CHECK (length(updated_by) BETWEEN 1 AND 256),
    version    INTEGER NOT NULL CHECK (version > 0)
) STRICT;

CREATE TABLE overrides (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- SHA-256 (hex) of the target tuple (tenant, user, api_key, endpoint, rule): one override
    -- per target. Hashed because the tuple itself can exceed a B-tree entry.
    target_key  TEXT NOT NULL UNIQUE CHECK (length(target_key) = 64),
    tenant      TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    user_name   TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    api_key     TEXT NOT NULL DEFAULT '' CHECK (length(api_key) <= 512),
    endpoint    TEXT NOT NULL DEFAULT '' CHECK (length(endpoint) <= 512),
    rule_name   TEXT NOT NULL DEFAULT '' CHECK (length(rule_name) <= 128),
    type        TEXT NOT NULL CHECK (type IN ('ban', 'multiplier', 'custom')),
    -- SQLite stores NaN as NULL, which NOT NULL refuses; 9e999 is +Infinity.
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
CREATE INDEX overrides_expires_at ON overrides (expires_at);

CREATE TABLE exemptions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    api_key    TEXT NOT NULL DEFAULT '' CHECK (length(api_key) <= 512),
    user_name  TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    tenant     TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    ip         TEXT NOT NULL DEFAULT '' CHECK (length(ip) <= 512),
    reason     TEXT NOT NULL CHECK (length(reason) <= 1024),
    expires_at INTEGER,
    created_by TEXT NOT NULL CHECK (length(created_by) BETWEEN 1 AND 256),
    created_at INTEGER NOT NULL,
    version    INTEGER NOT NULL CHECK (version > 0),
    CHECK ((api_key <> '') + (user_name <> '') + (tenant <> '') + (ip <> '') = 1),
    UNIQUE (api_key, user_name, tenant, ip)
) STRICT;
CREATE INDEX exemptions_expires_at ON exemptions (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE identities (
    kind       TEXT NOT NULL CHECK (kind IN ('api_key', 'user', 'tenant')),
    value      TEXT NOT NULL CHECK (length(value) BETWEEN 1 AND 512),
    tier       TEXT NOT NULL DEFAULT '' CHECK (length(tier) <= 512),
    tenant     TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    user_name  TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    trust      REAL CHECK (trust >= 0 AND trust <= 1),
    updated_by TEXT NOT NULL CHECK (length(updated_by) BETWEEN 1 AND 256),
    updated_at INTEGER NOT NULL,
    version    INTEGER NOT NULL CHECK (version > 0),
    PRIMARY KEY (kind, value),
    CHECK (kind = 'api_key' OR (tenant = '' AND user_name = ''))
) STRICT;

-- Tokens keep only the SHA-256 of their secret; there is no column a secret could go in.
CREATE TABLE tokens (
    name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    role       TEXT NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    hash       BLOB NOT NULL UNIQUE CHECK (typeof(hash) = 'blob' AND length(hash) = 32),
    created_by TEXT NOT NULL CHECK (length(created_by) BETWEEN 1 AND 256),
    created_at INTEGER NOT NULL,
    version    INTEGER NOT NULL CHECK (version > 0)
) STRICT;

CREATE TABLE audit_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    action  TEXT NOT NULL CHECK (action IN ('create', 'update', 'delete', 'expire')),
    kind    TEXT NOT NULL CHECK (kind IN ('rule', 'override', 'exemption', 'identity', 'token', 'policy_files', 'penalty')),
    target  TEXT NOT NULL CHECK (length(target) <= 1024),
    before  TEXT,
    after   TEXT,
    reason  TEXT NOT NULL CHECK (length(reason) <= 1024),
    -- The control version of the change; 0 for events that change nothing here.
    version INTEGER NOT NULL CHECK (version >= 0)
) STRICT;
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_actor ON audit_events (actor, id);
CREATE INDEX audit_events_kind ON audit_events (kind, id);
CREATE INDEX audit_events_target ON audit_events (target);

CREATE TABLE nodes (
    id             TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 256),
    addr           TEXT NOT NULL CHECK (length(addr) <= 256),
    policy_version INTEGER NOT NULL CHECK (policy_version >= 0),
    seen_at        INTEGER NOT NULL
) STRICT;
