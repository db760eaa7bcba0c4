-- schema_migrations records every migration applied, by number (see sqlstore.Migrate).

-- name: MigrationTableCreate
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    bigint PRIMARY KEY CHECK (version > 0),
    name       text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 128),
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: MigrationLock
-- Two nodes starting at once must not both migrate: a transaction-scoped advisory lock (the
-- key is "sluice_migrate" as bytes) serializes them; the second then finds nothing to do.
SELECT pg_advisory_xact_lock(7382645312745629285);

-- name: MigrationList
SELECT version FROM schema_migrations ORDER BY version;

-- name: MigrationInsert
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);
