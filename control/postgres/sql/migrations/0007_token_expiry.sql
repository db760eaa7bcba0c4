-- 0006: admin tokens with an expiry and a last-used time (docs/architecture.md, Admin API):
-- NULL for a token that never expires / was never used.

ALTER TABLE tokens ADD COLUMN expires_at timestamptz;
ALTER TABLE tokens ADD COLUMN last_used_at timestamptz;
