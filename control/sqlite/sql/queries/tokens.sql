-- name: TokenList
SELECT name, role, hash, created_by, created_at, version FROM tokens ORDER BY name;

-- name: TokenGet
SELECT name, role, hash, created_by, created_at, version FROM tokens WHERE name = ?1;

-- name: TokenGetByHash
SELECT name, role, hash, created_by, created_at, version FROM tokens WHERE hash = ?1;

-- name: TokenInsert
INSERT INTO tokens (name, role, hash, created_by, created_at, version) VALUES (?1, ?2, ?3, ?4, ?5, ?6);

-- name: TokenDelete
DELETE FROM tokens WHERE name = ?1;
