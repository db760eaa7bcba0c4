-- 0002: decision aggregates and the leader lease (docs/architecture.md, Control plane); the SQLite twin of control/postgres/sql/migrations/0002_events.sql. Nodes add their per-minute counts with additive upserts, so counts from every
-- node add up and a repeated flush of new counts is never lost.

-- Per (minute, rule, tenant): every decision. tenant '' is requests without a tenant.
CREATE TABLE usage_minutes (
    minute    INTEGER NOT NULL,
    rule_name TEXT NOT NULL CHECK (length(rule_name) BETWEEN 1 AND 128),
    tenant    TEXT NOT NULL CHECK (length(tenant) <= 512),
    allowed   INTEGER NOT NULL DEFAULT 0 CHECK (allowed >= 0),
    denied    INTEGER NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft      INTEGER NOT NULL DEFAULT 0 CHECK (soft >= 0),
    PRIMARY KEY (minute, rule_name, tenant)
) STRICT;
CREATE INDEX usage_minutes_tenant ON usage_minutes (tenant, minute);

-- Per (minute, rule, identity): denied and soft decisions only. identity_key is the SHA-256
-- (hex) of the identity's attributes, which together can exceed a B-tree entry.
CREATE TABLE violation_minutes (
    minute       INTEGER NOT NULL,
    rule_name    TEXT NOT NULL CHECK (length(rule_name) BETWEEN 1 AND 128),
    identity_key TEXT NOT NULL CHECK (length(identity_key) = 64),
    tenant       TEXT NOT NULL DEFAULT '' CHECK (length(tenant) <= 512),
    user_name    TEXT NOT NULL DEFAULT '' CHECK (length(user_name) <= 512),
    api_key      TEXT NOT NULL DEFAULT '' CHECK (length(api_key) <= 512),
    ip           TEXT NOT NULL DEFAULT '' CHECK (length(ip) <= 512),
    endpoint     TEXT NOT NULL DEFAULT '' CHECK (length(endpoint) <= 512),
    denied       INTEGER NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft         INTEGER NOT NULL DEFAULT 0 CHECK (soft >= 0),
    limit_value  INTEGER NOT NULL DEFAULT 0 CHECK (limit_value >= 0),
    PRIMARY KEY (minute, rule_name, identity_key)
) STRICT;
CREATE INDEX violation_minutes_minute ON violation_minutes (minute);
CREATE INDEX violation_minutes_tenant ON violation_minutes (tenant, minute);

-- Named leases: the holder of "abuse-detector" runs the detector until expires_at, and
-- renews before then; another node takes an expired lease over.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    holder     TEXT NOT NULL CHECK (length(holder) BETWEEN 1 AND 256),
    expires_at INTEGER NOT NULL
) STRICT;
