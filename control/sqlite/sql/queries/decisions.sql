-- Per-decision counts (migration 0009): each request once, by its final state. Counts are
-- added, never replaced, so every node's flushes add up.

-- name: DecisionAdd
-- ?1 is a JSON array of rows [minute, tenant, allowed, denied, soft], minute in microseconds,
-- each (minute, tenant) at most once.
INSERT INTO decision_minutes (minute, tenant, allowed, denied, soft)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4
FROM json_each(?1) WHERE true
ON CONFLICT (minute, tenant) DO UPDATE
SET allowed = decision_minutes.allowed + excluded.allowed,
    denied = decision_minutes.denied + excluded.denied,
    soft = decision_minutes.soft + excluded.soft;

-- name: DecisionHistory
-- Minutes in [?2, ?3) summed per step of ?4 microseconds from the Unix epoch (UTC); tenant ?1
-- '' matches every tenant.
SELECT (minute / ?4) * ?4 AS at, sum(allowed), sum(denied), sum(soft)
FROM decision_minutes
WHERE (?1 = '' OR tenant = ?1) AND minute >= ?2 AND minute < ?3
GROUP BY at
ORDER BY at;

-- name: DecisionPrune
DELETE FROM decision_minutes WHERE minute < ?1;
