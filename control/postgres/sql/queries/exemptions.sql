-- name: ExemptionListActive
-- $1 is now.
SELECT id, api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version
FROM exemptions WHERE expires_at IS NULL OR expires_at > $1 ORDER BY id;

-- name: ExemptionListExpired
SELECT id, api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version
FROM exemptions WHERE expires_at <= $1 ORDER BY id;

-- name: ExemptionGet
SELECT id, api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version
FROM exemptions WHERE id = $1;

-- name: ExemptionGetByTarget
SELECT id, api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version
FROM exemptions WHERE api_key = $1 AND user_name = $2 AND tenant = $3 AND ip = $4;

-- name: ExemptionInsert
INSERT INTO exemptions (api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING id;

-- name: ExemptionDelete
DELETE FROM exemptions WHERE id = $1;
