-- schema_migrations records every migration applied, by number (see sqlstore.Migrate).

-- name: MigrationTableCreate
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    bigint PRIMARY KEY CHECK (version > 0),
    name       text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 128),
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: MigrationLock
-- Two nodes starting at once must not both migrate: a transaction-scoped advisory lock
-- serializes them; the second then finds nothing to do. The key is "sluice:m" read as a
-- big-endian int64, unlikely to collide with another program's lock on the same database.
SELECT pg_advisory_xact_lock(8317151707346057837);

-- name: MigrationList
SELECT version FROM schema_migrations ORDER BY version;

-- name: MigrationInsert
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);
