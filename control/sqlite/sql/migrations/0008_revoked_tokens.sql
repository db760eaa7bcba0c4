-- 0007: the hashes of deleted admin tokens' secrets, so that a bootstrap secret revoked through
-- the API is not recreated from SLUICE_ADMIN_TOKEN at the next start; the SQLite twin of
-- control/postgres/sql/migrations/0007_revoked_tokens.sql.

CREATE TABLE revoked_tokens (
    hash       BLOB PRIMARY KEY CHECK (typeof(hash) = 'blob' AND length(hash) = 32),
    name       TEXT NOT NULL,
    revoked_at INTEGER NOT NULL
) STRICT;
