-- 0007: the hashes of deleted admin tokens' secrets, so that a bootstrap secret revoked through
-- the API is not recreated from SLUICE_ADMIN_TOKEN at the next start.

CREATE TABLE revoked_tokens (
    hash       bytea PRIMARY KEY CHECK (octet_length(hash) = 32),
    name       text NOT NULL,
    revoked_at timestamptz NOT NULL
);
