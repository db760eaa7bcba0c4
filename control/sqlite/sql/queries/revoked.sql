-- name: TokenRevokedInsert
INSERT INTO revoked_tokens (hash, name, revoked_at) VALUES (?1, ?2, ?3) ON CONFLICT (hash) DO NOTHING;

-- name: TokenRevokedGet
SELECT count(*) FROM revoked_tokens WHERE hash = ?1;
