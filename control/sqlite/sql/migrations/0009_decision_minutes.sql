-- 0009: per-decision counts (issue 29); the SQLite twin of
-- control/postgres/sql/migrations/0009_decision_minutes.sql. usage_minutes counts each rule's
-- own result, so a request three rules match is in three rows; decision_minutes counts each
-- request once, per (minute, tenant), by its final state: denied if any limit denied it, soft
-- if allowed and any limit was soft, else allowed. GET /admin/v1/usage/history without rule=
-- reads it. Minutes before this migration have no rows here.
CREATE TABLE decision_minutes (
    minute  INTEGER NOT NULL,
    tenant  TEXT NOT NULL CHECK (length(tenant) <= 512),
    allowed INTEGER NOT NULL DEFAULT 0 CHECK (allowed >= 0),
    denied  INTEGER NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft    INTEGER NOT NULL DEFAULT 0 CHECK (soft >= 0),
    PRIMARY KEY (minute, tenant)
) STRICT;
CREATE INDEX decision_minutes_tenant ON decision_minutes (tenant, minute);
