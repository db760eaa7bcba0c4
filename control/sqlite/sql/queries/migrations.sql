-- schema_migrations records every migration applied, by number (see sqlstore.Migrate).

-- name: MigrationTableCreate
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY CHECK (version > 0),
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    applied_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER))
) STRICT;

-- name: MigrationLock
-- Nothing to do: the migration's BEGIN IMMEDIATE already holds the database's write lock.
SELECT 1;

-- name: MigrationList
SELECT version FROM schema_migrations ORDER BY version;

-- name: MigrationInsert
INSERT INTO schema_migrations (version, name) VALUES (?1, ?2);
