-- 0006: admin tokens with an expiry and a last-used time (docs/architecture.md, Admin API); the
-- SQLite twin of control/postgres/sql/migrations/0006_token_expiry.sql. Both are microseconds
-- since the epoch, NULL for a token that never expires / was never used.

ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
ALTER TABLE tokens ADD COLUMN last_used_at INTEGER;
