-- name: VersionGet
SELECT version FROM control_version WHERE id = 1;

-- name: VersionBump
-- The first statement of every change, inside BEGIN IMMEDIATE: writers are serialized.
UPDATE control_version SET version = version + 1 WHERE id = 1 RETURNING version;
