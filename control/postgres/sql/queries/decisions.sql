-- Per-decision counts (migration 0009): each request once, by its final state. Counts are
-- added, never replaced, so every node's flushes add up.

-- name: DecisionAdd
-- $1 is a JSON array of rows [minute, tenant, allowed, denied, soft], minute in RFC 3339,
-- each (minute, tenant) at most once.
INSERT INTO decision_minutes (minute, tenant, allowed, denied, soft)
SELECT (r->>0)::timestamptz, r->>1, (r->>2)::bigint, (r->>3)::bigint, (r->>4)::bigint
FROM json_array_elements($1::json) AS r
ON CONFLICT (minute, tenant) DO UPDATE
SET allowed = decision_minutes.allowed + excluded.allowed,
    denied = decision_minutes.denied + excluded.denied,
    soft = decision_minutes.soft + excluded.soft;

-- name: DecisionHistory
-- Minutes in [$2, $3) summed per step of $4 microseconds from the Unix epoch (UTC); tenant $1
-- '' matches every tenant.
SELECT date_bin(make_interval(secs => $4::bigint / 1000000.0), minute, TIMESTAMPTZ '1970-01-01 00:00:00+00') AS at,
       sum(allowed)::bigint, sum(denied)::bigint, sum(soft)::bigint
FROM decision_minutes
WHERE ($1 = '' OR tenant = $1) AND minute >= $2 AND minute < $3
GROUP BY at
ORDER BY at;

-- name: DecisionPrune
DELETE FROM decision_minutes WHERE minute < $1;
