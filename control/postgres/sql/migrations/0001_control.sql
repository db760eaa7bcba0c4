-- 0001: the control store (docs/architecture.md, Control plane). The limits mirror control/validate.go;
-- they are here too so that no writer, buggy or not, can store what Sluice cannot read back.
-- Unset optional strings are '' (NOT NULL), so UNIQUE constraints treat them as values.

-- One row: the control version, bumped by every change in the change's own transaction. The
-- UPDATE that bumps it also serializes writers, which makes check-then-write in a change safe.
CREATE TABLE control_version (
    id      smallint PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL CHECK (version >= 0)
);
INSERT INTO control_version (id, version) VALUES (1, 0);

CREATE TABLE rules (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    body       text NOT NULL CHECK (octet_length(body) BETWEEN 2 AND 65536),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    updated_by text NOT NULL CHECK (char_length(updated_by) BETWEEN 1 AND 256),
    version    bigint NOT NULL CHECK (version > 0)
);

CREATE TABLE overrides (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- SHA-256 (hex) of the target tuple (tenant, user, api_key, endpoint, rule): one override
    -- per target. Hashed because the tuple itself can exceed a B-tree entry.
    target_key  text NOT NULL UNIQUE CHECK (char_length(target_key) = 64),
    tenant      text NOT NULL DEFAULT '' CHECK (char_length(tenant) <= 512),
    user_name   text NOT NULL DEFAULT '' CHECK (char_length(user_name) <= 512),
    api_key     text NOT NULL DEFAULT '' CHECK (char_length(api_key) <= 512),
    endpoint    text NOT NULL DEFAULT '' CHECK (char_length(endpoint) <= 512),
    rule_name   text NOT NULL DEFAULT '' CHECK (char_length(rule_name) <= 128),
    type        text NOT NULL CHECK (type IN ('ban', 'multiplier', 'custom')),
    -- NaN sorts above Infinity in PostgreSQL, so this also refuses NaN.
    value       double precision NOT NULL DEFAULT 0 CHECK (value >= 0 AND value < 'Infinity'),
    limit_value bigint NOT NULL DEFAULT 0 CHECK (limit_value >= 0),
    burst       bigint NOT NULL DEFAULT 0 CHECK (burst >= 0),
    expires_at  timestamptz NOT NULL,
    reason      text NOT NULL CHECK (char_length(reason) <= 1024),
    source      text NOT NULL CHECK (source IN ('api', 'automatic')),
    created_by  text NOT NULL CHECK (char_length(created_by) BETWEEN 1 AND 256),
    created_at  timestamptz NOT NULL,
    version     bigint NOT NULL CHECK (version > 0),
    CHECK (tenant <> '' OR user_name <> '' OR api_key <> '' OR endpoint <> ''),
    CHECK (type <> 'multiplier' OR value > 0)
);
CREATE INDEX overrides_expires_at ON overrides (expires_at);

CREATE TABLE exemptions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    api_key    text NOT NULL DEFAULT '' CHECK (char_length(api_key) <= 512),
    user_name  text NOT NULL DEFAULT '' CHECK (char_length(user_name) <= 512),
    tenant     text NOT NULL DEFAULT '' CHECK (char_length(tenant) <= 512),
    ip         text NOT NULL DEFAULT '' CHECK (char_length(ip) <= 512),
    reason     text NOT NULL CHECK (char_length(reason) <= 1024),
    expires_at timestamptz,
    created_by text NOT NULL CHECK (char_length(created_by) BETWEEN 1 AND 256),
    created_at timestamptz NOT NULL,
    version    bigint NOT NULL CHECK (version > 0),
    CHECK ((api_key <> '')::int + (user_name <> '')::int + (tenant <> '')::int + (ip <> '')::int = 1),
    UNIQUE (api_key, user_name, tenant, ip)
);
CREATE INDEX exemptions_expires_at ON exemptions (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE identities (
    kind       text NOT NULL CHECK (kind IN ('api_key', 'user', 'tenant')),
    value      text NOT NULL CHECK (char_length(value) BETWEEN 1 AND 512),
    tier       text NOT NULL DEFAULT '' CHECK (char_length(tier) <= 512),
    tenant     text NOT NULL DEFAULT '' CHECK (char_length(tenant) <= 512),
    user_name  text NOT NULL DEFAULT '' CHECK (char_length(user_name) <= 512),
    trust      double precision CHECK (trust >= 0 AND trust <= 1),
    updated_by text NOT NULL CHECK (char_length(updated_by) BETWEEN 1 AND 256),
    updated_at timestamptz NOT NULL,
    version    bigint NOT NULL CHECK (version > 0),
    PRIMARY KEY (kind, value),
    CHECK (kind = 'api_key' OR (tenant = '' AND user_name = ''))
);

-- Tokens keep only the SHA-256 of their secret; there is no column a secret could go in.
CREATE TABLE tokens (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    role       text NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    hash       bytea NOT NULL UNIQUE CHECK (octet_length(hash) = 32),
    created_by text NOT NULL CHECK (char_length(created_by) BETWEEN 1 AND 256),
    created_at timestamptz NOT NULL,
    version    bigint NOT NULL CHECK (version > 0)
);

CREATE TABLE audit_events (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    actor   text NOT NULL CHECK (char_length(actor) BETWEEN 1 AND 256),
    action  text NOT NULL CHECK (action IN ('create', 'update', 'delete', 'expire')),
    kind    text NOT NULL CHECK (kind IN ('rule', 'override', 'exemption', 'identity', 'token', 'policy_files', 'penalty')),
    target  text NOT NULL CHECK (char_length(target) <= 1024),
    before  text,
    after   text,
    reason  text NOT NULL CHECK (char_length(reason) <= 1024),
    -- The control version of the change; 0 for events that change nothing here.
    version bigint NOT NULL CHECK (version >= 0)
);
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_actor ON audit_events (actor, id);
CREATE INDEX audit_events_kind ON audit_events (kind, id);
-- A hash index: targets may exceed a B-tree entry, and they are only ever compared for equality.
CREATE INDEX audit_events_target ON audit_events USING hash (target);

CREATE TABLE nodes (
    id             text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 256),
    addr           text NOT NULL CHECK (char_length(addr) <= 256),
    policy_version bigint NOT NULL CHECK (policy_version >= 0),
    seen_at        timestamptz NOT NULL
);
