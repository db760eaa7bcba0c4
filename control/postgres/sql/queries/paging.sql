-- Pages of the lists (issue 29): each starts after the previous page's last key, at most
-- the limit; $1.. as in the list queries they page.

-- name: ExemptionPage
-- $1 is now; ids after $2, at most $3.
SELECT id, api_key, user_name, tenant, ip, reason, expires_at, created_by, created_at, version
FROM exemptions WHERE (expires_at IS NULL OR expires_at > $1) AND id > $2 ORDER BY id LIMIT $3;

-- name: IdentityPage
-- $1 is a kind, or '' for every kind; (kind, value) after ($2, $3), at most $4.
SELECT kind, value, tier, tenant, user_name, trust, updated_by, updated_at, version
FROM identities WHERE ($1 = '' OR kind = $1) AND (kind > $2 OR (kind = $2 AND value > $3))
ORDER BY kind, value LIMIT $4;

-- name: RulePage
SELECT name, body, created_at, updated_at, updated_by, version FROM rules
WHERE name > $1 ORDER BY name LIMIT $2;

-- name: TokenPage
SELECT name, role, hash, created_by, created_at, version, expires_at, last_used_at FROM tokens
WHERE name > $1 ORDER BY name LIMIT $2;

-- name: DomainPage
SELECT name, body, created_at, updated_at, updated_by, version FROM domains
WHERE name > $1 ORDER BY name LIMIT $2;
