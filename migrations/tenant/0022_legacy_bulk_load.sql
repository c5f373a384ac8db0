-- `imstream legacy copy` in parallel and in bulk (issue 18): each month of
-- the legacy table has its own copy cursor, so several months are copied at
-- once and each resumes where it stopped; a past (sealed) month may be
-- bulk-loaded without its secondary indexes, built after its last row. While
-- that lasts the catalog says `loading` (readers skip the month: dual read
-- serves its rows from the legacy table), and `loading_from` keeps the status
-- the month goes back to.

ALTER TABLE im_group_message_shards MODIFY COLUMN status VARCHAR(16) NOT NULL DEFAULT 'prepared'
  COMMENT 'prepared/writable/sealing/sealed/archived; loading: bulk-loaded by imstream legacy copy, indexes not built yet';

CREATE TABLE IF NOT EXISTS im_legacy_migration_months (
  shard_month CHAR(6) NOT NULL COMMENT 'UTC month YYYYMM of the legacy rows',
  -- last copied (created_at, id) of this month; NULL before its first row
  cursor_created_at DATETIME(3) NULL,
  cursor_id BIGINT NULL,
  -- no copy of a legacy row after this (created_at, id) exists in the month
  -- table, so those rows are inserted without looking first; NULL: no copy
  -- at all; the month's end when copies of unknown extent were there before
  -- this row. Survives `copy --restart` (which only moves the cursor back).
  fresh_created_at DATETIME(3) NULL,
  fresh_id BIGINT NULL,
  rows_copied BIGINT NOT NULL DEFAULT 0,
  batches BIGINT NOT NULL DEFAULT 0,
  -- the catalog status to put back once the indexes are built; NULL unless
  -- the month is bulk-loaded (catalog status `loading`)
  loading_from VARCHAR(16) NULL,
  -- 1: every legacy row of the month is copied (and its indexes built)
  done TINYINT(1) NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
