-- Decision aggregates and leases (migration 0002). Counts are added, never replaced, so
-- every node's flushes add up.

-- name: UsageAdd
-- ?1 is a JSON array of rows [minute, rule_name, tenant, allowed, denied, soft], minute in
-- microseconds, each (minute, rule_name, tenant) at most once. "WHERE true" is SQLite's
-- documented way to tell the upsert's ON CONFLICT from a join's ON.
INSERT INTO usage_minutes (minute, rule_name, tenant, allowed, denied, soft)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5
FROM json_each(?1) WHERE true
ON CONFLICT (minute, rule_name, tenant) DO UPDATE
SET allowed = usage_minutes.allowed + excluded.allowed,
    denied = usage_minutes.denied + excluded.denied,
    soft = usage_minutes.soft + excluded.soft;

-- name: ViolationAdd
-- ?1 is a JSON array of rows [minute, rule_name, identity_key, tenant, user_name, api_key, ip,
-- endpoint, denied, soft, limit_value], minute in microseconds, each (minute, rule_name,
-- identity_key) at most once.
INSERT INTO violation_minutes (minute, rule_name, identity_key, tenant, user_name, api_key, ip, endpoint,
                               denied, soft, limit_value)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7,
       value ->> 8, value ->> 9, value ->> 10
FROM json_each(?1) WHERE true
ON CONFLICT (minute, rule_name, identity_key) DO UPDATE
SET denied = violation_minutes.denied + excluded.denied,
    soft = violation_minutes.soft + excluded.soft,
    limit_value = excluded.limit_value;

-- name: UsageHistory
-- Minutes in [?3, ?4) summed per step of ?5 microseconds from the Unix epoch (UTC);
-- empty filters match everything. Times are microseconds, so a step is integer division.
SELECT (minute / ?5) * ?5 AS at, sum(allowed), sum(denied), sum(soft)
FROM usage_minutes
WHERE (?1 = '' OR rule_name = ?1) AND (?2 = '' OR tenant = ?2) AND minute >= ?3 AND minute < ?4
GROUP BY at
ORDER BY at;

-- name: ViolationList
-- Minutes in [?6, ?7); empty filters match everything; newest first, at most ?8.
SELECT minute, rule_name, tenant, user_name, api_key, ip, endpoint, denied, soft, limit_value
FROM violation_minutes
WHERE (?1 = '' OR tenant = ?1) AND (?2 = '' OR user_name = ?2) AND (?3 = '' OR api_key = ?3)
  AND (?4 = '' OR ip = ?4) AND (?5 = '' OR rule_name = ?5) AND minute >= ?6 AND minute < ?7
ORDER BY minute DESC, rule_name, tenant, user_name, api_key, ip, endpoint
LIMIT ?8;

-- name: UsageTotals
-- The abuse detector's window: minutes in [?1, ?2) summed per rule and tenant. The caller
-- orders the rows (collations differ between the databases).
SELECT rule_name, tenant, sum(allowed), sum(denied), sum(soft)
FROM usage_minutes
WHERE minute >= ?1 AND minute < ?2
GROUP BY rule_name, tenant;

-- name: ViolationTotalsNoTenant
-- The abuse detector's window for requests without a tenant: minutes in [?1, ?2) summed per
-- rule and identity, over the index on (tenant, minute).
SELECT rule_name, user_name, api_key, ip, sum(denied), sum(soft)
FROM violation_minutes
WHERE tenant = '' AND minute >= ?1 AND minute < ?2
GROUP BY rule_name, user_name, api_key, ip;

-- name: UsagePrune
DELETE FROM usage_minutes WHERE minute < ?1;

-- name: ViolationPrune
DELETE FROM violation_minutes WHERE minute < ?1;

-- name: LeaseAcquire
-- Takes the lease ?1 for holder ?2 until ?3 if it is free, expired by ?4, or already ?2's
-- (a renewal); returns no row when another holder has it.
INSERT INTO leases (name, holder, expires_at) VALUES (?1, ?2, ?3)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leases.holder = excluded.holder OR leases.expires_at <= ?4
RETURNING holder;

-- name: LeaseGet
SELECT holder, expires_at FROM leases WHERE name = ?1;

-- name: LeaseRelease
DELETE FROM leases WHERE name = ?1 AND holder = ?2;
