-- 0002: decision aggregates and the leader lease (docs/architecture.md, Control plane). Nodes add their per-minute counts with additive upserts, so counts from every
-- node add up and a repeated flush of new counts is never lost.

-- Per (minute, rule, tenant): every decision. tenant '' is requests without a tenant.
CREATE TABLE usage_minutes (
    minute    timestamptz NOT NULL,
    rule_name text NOT NULL CHECK (char_length(rule_name) BETWEEN 1 AND 128),
    tenant    text NOT NULL CHECK (char_length(tenant) <= 512),
    allowed   bigint NOT NULL DEFAULT 0 CHECK (allowed >= 0),
    denied    bigint NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft      bigint NOT NULL DEFAULT 0 CHECK (soft >= 0),
    PRIMARY KEY (minute, rule_name, tenant)
);
CREATE INDEX usage_minutes_tenant ON usage_minutes (tenant, minute);

-- Per (minute, rule, identity): denied and soft decisions only. identity_key is the SHA-256
-- (hex) of the identity's attributes, which together can exceed a B-tree entry.
CREATE TABLE violation_minutes (
    minute       timestamptz NOT NULL,
    rule_name    text NOT NULL CHECK (char_length(rule_name) BETWEEN 1 AND 128),
    identity_key text NOT NULL CHECK (char_length(identity_key) = 64),
    tenant       text NOT NULL DEFAULT '' CHECK (char_length(tenant) <= 512),
    user_name    text NOT NULL DEFAULT '' CHECK (char_length(user_name) <= 512),
    api_key      text NOT NULL DEFAULT '' CHECK (char_length(api_key) <= 512),
    ip           text NOT NULL DEFAULT '' CHECK (char_length(ip) <= 512),
    endpoint     text NOT NULL DEFAULT '' CHECK (char_length(endpoint) <= 512),
    denied       bigint NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft         bigint NOT NULL DEFAULT 0 CHECK (soft >= 0),
    limit_value  bigint NOT NULL DEFAULT 0 CHECK (limit_value >= 0),
    PRIMARY KEY (minute, rule_name, identity_key)
);
CREATE INDEX violation_minutes_minute ON violation_minutes (minute);
CREATE INDEX violation_minutes_tenant ON violation_minutes (tenant, minute);

-- Named leases: the holder of "abuse-detector" runs the detector until expires_at, and
-- renews before then; another node takes an expired lease over.
CREATE TABLE leases (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    holder     text NOT NULL CHECK (char_length(holder) BETWEEN 1 AND 256),
    expires_at timestamptz NOT NULL
);
