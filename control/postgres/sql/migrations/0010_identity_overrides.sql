-- 0010: overrides may name an API key by its hash and an IP address or CIDR (issue 27: the
-- abuse detector penalizes the callers it sees, and it sees API keys only hashed). The SQLite
-- twin is control/sqlite/sql/migrations/0010_identity_overrides.sql. overrides_check is the
-- name PostgreSQL gave 0001's unnamed "some target" constraint.

ALTER TABLE overrides
    ADD COLUMN ip text NOT NULL DEFAULT '' CHECK (char_length(ip) <= 512),
    ADD COLUMN api_key_hash text NOT NULL DEFAULT '' CHECK (api_key_hash = '' OR char_length(api_key_hash) = 33);
ALTER TABLE overrides DROP CONSTRAINT overrides_check;
ALTER TABLE overrides ADD CONSTRAINT overrides_target_check
    CHECK (tenant <> '' OR user_name <> '' OR api_key <> '' OR endpoint <> '' OR ip <> '' OR api_key_hash <> '');
