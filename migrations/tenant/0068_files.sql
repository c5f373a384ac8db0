-- Files uploaded through the gateway (issue 41, seeds 000 §3.1 item 4 and
-- 001 §6.1): the bytes live in the object store under `object_key`; here
-- only what the service checks and shows. `state`: uploading (the bytes
-- are on their way; never served), stored, unavailable (flagged by the
-- scan or an operator: refused to everyone), deleted (the object is gone
-- or queued to go at `delete_after`).
CREATE TABLE IF NOT EXISTS im_files (
  file_id VARBINARY(32) NOT NULL,
  uploader_uid BIGINT NOT NULL,
  object_key VARBINARY(512) NOT NULL,
  size BIGINT NOT NULL DEFAULT 0,
  mime VARCHAR(128) NOT NULL DEFAULT 'application/octet-stream' COMMENT 'sniffed from the bytes',
  name VARCHAR(255) NOT NULL DEFAULT '' COMMENT 'as the uploader named it (shown, never trusted)',
  state VARCHAR(16) NOT NULL DEFAULT 'uploading',
  scan VARCHAR(16) NOT NULL DEFAULT 'pending' COMMENT 'pending/clean/flagged',
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  referenced_at DATETIME(3) NULL,
  delete_after DATETIME(3) NULL,
  PRIMARY KEY (file_id),
  KEY idx_uploader (uploader_uid, created_at),
  KEY idx_unreferenced (state, referenced_at, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Who refers to a file: a message (topic, seq) or a profile's picture
-- (`topic` empty, `seq` the user or group id). Written by the send path
-- when it accepts the message (a download must not wait for a
-- projection) and again by the references projection (replay).
CREATE TABLE IF NOT EXISTS im_file_refs (
  file_id VARBINARY(32) NOT NULL,
  topic VARBINARY(64) NOT NULL,
  seq BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (file_id, topic, seq),
  KEY idx_message (topic, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
