-- State of `imstream legacy` (seed 000 §9): one row per tenant database
-- with the copy cursor (created_at, id), the per-tenant dual-read switch and
-- the migration's status; one row per copied batch with its cursors, counts
-- and content hash.

CREATE TABLE IF NOT EXISTS im_legacy_migration (
  id TINYINT NOT NULL,
  -- planned -> copying -> copied -> verified -> cut_over
  status VARCHAR(16) NOT NULL DEFAULT 'planned',
  -- 1: history reads also consult im_group_messages (deduped by topic+seq).
  dual_read TINYINT(1) NOT NULL DEFAULT 0,
  cursor_created_at DATETIME(3) NULL,
  cursor_id BIGINT NULL,
  rows_total BIGINT NOT NULL DEFAULT 0,
  rows_copied BIGINT NOT NULL DEFAULT 0,
  rows_inserted BIGINT NOT NULL DEFAULT 0,
  batches BIGINT NOT NULL DEFAULT 0,
  planned_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_legacy_migration_batches (
  batch_no BIGINT NOT NULL AUTO_INCREMENT,
  from_created_at DATETIME(3) NULL,
  from_id BIGINT NULL,
  to_created_at DATETIME(3) NOT NULL,
  to_id BIGINT NOT NULL,
  rows_read INT NOT NULL,
  rows_inserted INT NOT NULL,
  content_hash CHAR(64) NULL,
  -- ok | failed
  status VARCHAR(16) NOT NULL,
  error TEXT NULL,
  finished_at DATETIME(3) NOT NULL,
  PRIMARY KEY (batch_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
