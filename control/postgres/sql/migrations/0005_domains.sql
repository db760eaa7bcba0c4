-- 0005: Envoy domains (docs/architecture.md, Envoy domains): domains in the reference service's
-- format created through the admin API, and their audit kind. The SQLite twin is
-- control/sqlite/sql/migrations/0005_domains.sql.

CREATE TABLE domains (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    body       text NOT NULL CHECK (octet_length(body) BETWEEN 2 AND 1048576),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    updated_by text NOT NULL CHECK (char_length(updated_by) BETWEEN 1 AND 256),
    version    bigint NOT NULL CHECK (version > 0)
);

ALTER TABLE audit_events DROP CONSTRAINT audit_events_kind_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_kind_check
    CHECK (kind IN ('rule', 'override', 'exemption', 'identity', 'token', 'policy_files', 'penalty', 'domain'));
