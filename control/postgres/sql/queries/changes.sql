-- name: AuditSince
-- Ordered by version alone (and the next two too), so that the version index answers them
-- rather than a scan of the table in its own order.
-- The events of the changes after control version $1 (control.ChangeReader).
SELECT version, kind, target, before FROM audit_events WHERE version > $1 ORDER BY version;

-- name: OverrideListSince
SELECT id, tenant, user_name, api_key, endpoint, rule_name, type, value, limit_value, burst,
       expires_at, reason, source, created_by, created_at, version, ip, api_key_hash
FROM overrides WHERE version > $1 ORDER BY version;

-- name: IdentityListSince
SELECT kind, value, tier, tenant, user_name, trust, updated_by, updated_at, version
FROM identities WHERE version > $1 ORDER BY version;
