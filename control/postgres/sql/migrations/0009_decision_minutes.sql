-- 0009: per-decision counts (issue 29). usage_minutes counts each rule's own result, so a
-- request three rules match is in three rows; decision_minutes counts each request once, per
-- (minute, tenant), by its final state: denied if any limit denied it, soft if allowed and any
-- limit was soft, else allowed. GET /admin/v1/usage/history without rule= reads it. Minutes
-- before this migration have no rows here.
CREATE TABLE decision_minutes (
    minute  timestamptz NOT NULL,
    tenant  text NOT NULL CHECK (char_length(tenant) <= 512),
    allowed bigint NOT NULL DEFAULT 0 CHECK (allowed >= 0),
    denied  bigint NOT NULL DEFAULT 0 CHECK (denied >= 0),
    soft    bigint NOT NULL DEFAULT 0 CHECK (soft >= 0),
    PRIMARY KEY (minute, tenant)
);
CREATE INDEX decision_minutes_tenant ON decision_minutes (tenant, minute);
