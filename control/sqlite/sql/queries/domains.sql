-- name: DomainList
SELECT name, body, created_at, updated_at, updated_by, version FROM domains ORDER BY name;

-- name: DomainGet
SELECT name, body, created_at, updated_at, updated_by, version FROM domains WHERE name = ?1;

-- name: DomainInsert
INSERT INTO domains (name, body, created_at, updated_at, updated_by, version)
VALUES (?1, ?2, ?3, ?3, ?4, ?5);

-- name: DomainUpdate
UPDATE domains SET body = ?2, updated_at = ?3, updated_by = ?4, version = ?5 WHERE name = ?1;

-- name: DomainDelete
DELETE FROM domains WHERE name = ?1;
