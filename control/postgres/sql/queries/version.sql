-- name: VersionGet
SELECT version FROM control_version WHERE id = 1;

-- name: VersionBump
-- The first statement of every change: the row lock it takes serializes writers until commit.
UPDATE control_version SET version = version + 1 WHERE id = 1 RETURNING version;

-- name: VersionNotify
-- Delivered to every LISTENer when the change commits, never if it rolls back.
SELECT pg_notify('sluice_control', $1);
