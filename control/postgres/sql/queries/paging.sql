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

-- name: ViolationPage
-- Minutes in [$6, $7); empty filters match everything; after ($8, $9, $10) in the order
-- newest minute first, then rule and identity key (no cursor: $8 is $7); at most $11.
SELECT minute, rule_name, identity_key, tenant, user_name, api_key, ip, endpoint, denied, soft, limit_value
FROM violation_minutes
WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR user_name = $2) AND ($3 = '' OR api_key = $3)
  AND ($4 = '' OR ip = $4) AND ($5 = '' OR rule_name = $5) AND minute >= $6 AND minute < $7
  AND (minute < $8 OR (minute = $8 AND (rule_name > $9 OR (rule_name = $9 AND identity_key > $10))))
ORDER BY minute DESC, rule_name, identity_key
LIMIT $11;
