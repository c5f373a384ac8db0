-- Admin statistics (seed 000 §6.6), kept by the stats pipeline; the admin
-- API reads only these tables, never the month tables. A row's counts are
-- the sizes of the seq sets beside them ("low-last,low-last"), so an event
-- delivered twice or replayed adds nothing.
CREATE TABLE IF NOT EXISTS im_stats_daily (
  day DATE NOT NULL COMMENT 'UTC',
  topic VARCHAR(64) NOT NULL,
  messages BIGINT NOT NULL DEFAULT 0 COMMENT 'messages sent, edits included',
  edits BIGINT NOT NULL DEFAULT 0 COMMENT 'replacement messages (Tinode head.replace)',
  recalls BIGINT NOT NULL DEFAULT 0,
  deletes BIGINT NOT NULL DEFAULT 0 COMMENT 'seqs deleted for everyone',
  message_seqs MEDIUMTEXT NOT NULL,
  edit_seqs MEDIUMTEXT NOT NULL,
  recall_seqs MEDIUMTEXT NOT NULL,
  delete_seqs MEDIUMTEXT NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (day, topic),
  KEY idx_stats_topic_day (topic, day)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_stats_senders (
  day DATE NOT NULL COMMENT 'UTC',
  topic VARCHAR(64) NOT NULL,
  uid BIGINT NOT NULL,
  PRIMARY KEY (day, topic, uid),
  KEY idx_stats_senders_day_uid (day, uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
