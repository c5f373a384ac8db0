-- Edits are ordered by the seq of their replacement message (Tinode's
-- head.replace): an edit applies only when it is newer than the last one
-- applied, so any delivery order and any replay leave the same row.
-- Admin commands (seed 002 §7.2) are executed once per command_id.

ALTER TABLE im_message_revisions
  ADD COLUMN edit_seq BIGINT NULL COMMENT 'seq of the replacement message of an edit' AFTER version;

CREATE TABLE IF NOT EXISTS im_admin_commands (
  command_id VARCHAR(64) NOT NULL,
  kind VARCHAR(32) NOT NULL,
  operator VARCHAR(64) NOT NULL,
  status VARCHAR(16) NOT NULL COMMENT 'running/ok/rejected/failed',
  message VARCHAR(512) NOT NULL DEFAULT '',
  event_ids JSON NULL,
  issued_at DATETIME(3) NOT NULL,
  completed_at DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (command_id),
  KEY idx_status (status, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
