-- References to messages that must keep finding them months later (seed 000
-- §12 item 8): reports, favorites and a group's files. Each row keeps only
-- (topic, seq); the message is resolved through the routes and month tables
-- (or the month's archive) when it is read, so a month switch, an archive
-- or a recall never leaves a reference pointing at the wrong thing.

-- The moderation queue, kept by the references pipeline from
-- MessageReported / MessageReportResolved. One report per reporter and
-- message: the id is derived from (topic, seq, reporter).
CREATE TABLE IF NOT EXISTS im_message_reports (
  report_id VARCHAR(120) NOT NULL,
  topic VARCHAR(64) NOT NULL,
  seq BIGINT NOT NULL,
  reporter_uid BIGINT NOT NULL,
  reason VARCHAR(500) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'open' COMMENT 'open, dismissed or actioned',
  created_at DATETIME(3) NOT NULL,
  resolved_at DATETIME(3) NULL,
  resolved_by VARCHAR(64) NULL COMMENT 'name of the admin token',
  note VARCHAR(500) NOT NULL DEFAULT '',
  PRIMARY KEY (report_id),
  KEY idx_reports_status_time (status, created_at, report_id),
  KEY idx_reports_message (topic, seq),
  KEY idx_reports_time (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- A user's saved messages, kept by the relations pipeline from
-- FavoriteAdded / FavoriteRemoved (user events, in order per user).
CREATE TABLE IF NOT EXISTS im_favorites (
  uid BIGINT NOT NULL,
  topic VARCHAR(64) NOT NULL,
  seq BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (uid, topic, seq),
  KEY idx_favorites_uid_time (uid, created_at, topic, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Messages of a conversation that carry a file (Drafty entities EX, IM,
-- AU, VD), kept by the references pipeline from MessageSent.
CREATE TABLE IF NOT EXISTS im_group_files (
  topic VARCHAR(64) NOT NULL,
  seq BIGINT NOT NULL,
  kind VARCHAR(16) NOT NULL COMMENT 'file, image, audio or video',
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (topic, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
