-- name: IdentityList
-- $1 is a kind, or '' for every kind.
SELECT kind, value, tier, tenant, user_name, trust, updated_by, updated_at, version
FROM identities WHERE $1 = '' OR kind = $1 ORDER BY kind, value;

-- name: IdentityGet
SELECT kind, value, tier, tenant, user_name, trust, updated_by, updated_at, version
FROM identities WHERE kind = $1 AND value = $2;

-- name: IdentityInsert
INSERT INTO identities (kind, value, tier, tenant, user_name, trust, updated_by, updated_at, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: IdentityUpdate
UPDATE identities SET tier = $3, tenant = $4, user_name = $5, trust = $6, updated_by = $7,
                      updated_at = $8, version = $9
WHERE kind = $1 AND value = $2;

-- name: IdentityDelete
DELETE FROM identities WHERE kind = $1 AND value = $2;
