-- name: NodeUpsert
INSERT INTO nodes (id, addr, policy_version, seen_at, stats) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO UPDATE
SET addr = excluded.addr, policy_version = excluded.policy_version, seen_at = excluded.seen_at, stats = excluded.stats;

-- name: NodeList
SELECT id, addr, policy_version, seen_at, stats FROM nodes WHERE seen_at >= $1 ORDER BY id;

-- name: NodePrune
DELETE FROM nodes WHERE seen_at < $1;
