-- name: AuditInsert
INSERT INTO audit_events (at, actor, action, kind, target, before, after, reason, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
RETURNING id;

-- name: AuditList
-- At in [?1, ?2); empty filters match everything; ids below ?7, newest first, at most ?8.
SELECT id, at, actor, action, kind, target, before, after, reason, version
FROM audit_events
WHERE at >= ?1 AND at < ?2
  AND (?3 = '' OR actor = ?3) AND (?4 = '' OR action = ?4)
  AND (?5 = '' OR kind = ?5) AND (?6 = '' OR target = ?6)
  AND id < ?7
ORDER BY id DESC
LIMIT ?8;

-- name: AuditPrune
DELETE FROM audit_events WHERE at < ?1;
