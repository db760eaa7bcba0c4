-- Updates in place of an override's or an exemption's changeable fields (PATCH): the row, its
-- id and its target stay, so the policy never lacks it between two statements.

-- name: OverrideUpdate
UPDATE overrides SET value = ?2, limit_value = ?3, burst = ?4, expires_at = ?5, reason = ?6, version = ?7
WHERE id = ?1;

-- name: ExemptionUpdate
UPDATE exemptions SET reason = ?2, expires_at = ?3, version = ?4
WHERE id = ?1;
