-- 0004: node stats (docs/architecture.md, Dashboard): each heartbeat carries the node's live
-- decision rates, latency, store state and top consumers (telemetry/fleetstats, JSON), which the
-- admin API merges across the fleet. The SQLite twin is
-- control/sqlite/sql/migrations/0004_node_stats.sql.

ALTER TABLE nodes ADD COLUMN stats TEXT NOT NULL DEFAULT '' CHECK (octet_length(stats) <= 1048576);
