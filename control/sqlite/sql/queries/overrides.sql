-- name: OverrideListActive
-- ?1 is now; empty filters match everything; a page: ids after ?6, at most ?7.
SELECT id, tenant, user_name, api_key, endpoint, rule_name, type, value, limit_value, burst,
       expires_at, reason, source, created_by, created_at, version, ip, api_key_hash
FROM overrides
WHERE expires_at > ?1
  AND (?2 = '' OR tenant = ?2) AND (?3 = '' OR user_name = ?3)
  AND (?4 = '' OR api_key = ?4) AND (?5 = '' OR source = ?5)
  AND id > ?6
ORDER BY id
LIMIT ?7;

-- name: OverrideListExpired
SELECT id, tenant, user_name, api_key, endpoint, rule_name, type, value, limit_value, burst,
       expires_at, reason, source, created_by, created_at, version, ip, api_key_hash
FROM overrides WHERE expires_at <= ?1 ORDER BY id;

-- name: OverrideGet
SELECT id, tenant, user_name, api_key, endpoint, rule_name, type, value, limit_value, burst,
       expires_at, reason, source, created_by, created_at, version, ip, api_key_hash
FROM overrides WHERE id = ?1;

-- name: OverrideGetByTarget
SELECT id, tenant, user_name, api_key, endpoint, rule_name, type, value, limit_value, burst,
       expires_at, reason, source, created_by, created_at, version, ip, api_key_hash
FROM overrides WHERE target_key = ?1;

-- name: OverrideInsert
INSERT INTO overrides (target_key, tenant, user_name, api_key, endpoint, rule_name, type, value,
                       limit_value, burst, expires_at, reason, source, created_by, created_at, version,
                       ip, api_key_hash)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
RETURNING id;

-- name: OverrideDelete
DELETE FROM overrides WHERE id = ?1;
