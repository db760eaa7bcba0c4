-- name: RuleList
SELECT name, body, created_at, updated_at, updated_by, version FROM rules ORDER BY name;

-- name: RuleGet
SELECT name, body, created_at, updated_at, updated_by, version FROM rules WHERE name = ?1;

-- name: RuleInsert
INSERT INTO rules (name, body, created_at, updated_at, updated_by, version)
VALUES (?1, ?2, ?3, ?3, ?4, ?5);

-- name: RuleUpdate
UPDATE rules SET body = ?2, updated_at = ?3, updated_by = ?4, version = ?5 WHERE name = ?1;

-- name: RuleDelete
DELETE FROM rules WHERE name = ?1;
