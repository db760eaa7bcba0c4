-- name: NodeUpsert
INSERT INTO nodes (id, addr, policy_version, seen_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE
SET addr = excluded.addr, policy_version = excluded.policy_version, seen_at = excluded.seen_at;

-- name: NodeList
SELECT id, addr, policy_version, seen_at FROM nodes WHERE seen_at >= $1 ORDER BY id;

-- name: NodePrune
DELETE FROM nodes WHERE seen_at < $1;
