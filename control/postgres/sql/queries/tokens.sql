-- name: TokenList
SELECT name, role, hash, created_by, created_at, version, expires_at, last_used_at FROM tokens ORDER BY name;

-- name: TokenGet
SELECT name, role, hash, created_by, created_at, version, expires_at, last_used_at FROM tokens WHERE name = $1;

-- name: TokenGetByHash
SELECT name, role, hash, created_by, created_at, version, expires_at, last_used_at FROM tokens WHERE hash = $1;

-- name: TokenInsert
INSERT INTO tokens (name, role, hash, created_by, created_at, version, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: TokenDelete
DELETE FROM tokens WHERE name = $1;

-- name: TokenUsed
-- Not a change: no version, no audit event. Only moves last_used_at forward.
UPDATE tokens SET last_used_at = $2 WHERE name = $1 AND (last_used_at IS NULL OR last_used_at < $2);
