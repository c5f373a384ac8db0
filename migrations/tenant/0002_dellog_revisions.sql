-- User-view delete ranges (Tinode's dellog: deletedfor = 0 is a hard delete,
-- ranges are [low, hi)) and message revisions with their month (seed 000 §7).

CREATE TABLE IF NOT EXISTS im_dellog (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) NOT NULL,
  deletedfor BIGINT NOT NULL DEFAULT 0 COMMENT 'uid whose view is cleared; 0 = everyone',
  delid INT NOT NULL COMMENT 'delete transaction id, per topic',
  low BIGINT NOT NULL,
  hi BIGINT NOT NULL COMMENT 'exclusive',
  event_id VARCHAR(64) NULL COMMENT 'event that produced the range; replays are idempotent',
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_event_range (event_id, low),
  KEY idx_topic_for (topic, deletedfor, low, hi),
  KEY idx_topic_delid (topic, delid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_message_revisions (
  id BIGINT NOT NULL AUTO_INCREMENT,
  topic VARCHAR(64) NOT NULL,
  shard_month CHAR(6) NULL,
  seqid BIGINT NOT NULL,
  message_id BIGINT NOT NULL,
  version INT NOT NULL,
  action VARCHAR(16) NOT NULL COMMENT 'edit/recall/delete',
  actor_uid BIGINT NOT NULL,
  old_content JSON NULL,
  old_head JSON NULL,
  event_id VARCHAR(64) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_event (event_id),
  UNIQUE KEY uk_topic_seq_version (topic, seqid, version),
  KEY idx_message (message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
