-- The chat list (issue 14): the conversations projection keeps per-topic
-- state once (`im_conversation_topics`: last seq, last activity, the last
-- message's preview) and one row per (user, conversation) that changes only
-- with membership (`im_conversations`), so a message costs one topic row
-- however big the group. Unread = last_seq - read_seq (im_subscriptions)
-- minus the user's deleted ranges (im_dellog), derived at read time.

CREATE TABLE IF NOT EXISTS im_conversations (
  uid BIGINT NOT NULL,
  topic VARCHAR(64) NOT NULL,
  kind VARCHAR(8) NOT NULL COMMENT 'grp/p2p',
  peer_uid BIGINT NOT NULL DEFAULT 0 COMMENT 'the other user of a p2p topic; 0 for groups',
  joined_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid, topic),
  KEY idx_topic (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_conversation_topics (
  topic VARCHAR(64) NOT NULL,
  last_seq BIGINT NOT NULL DEFAULT 0,
  -- epoch ms of the last message (or the creation), Tinode's `touched`
  touched_ms BIGINT NOT NULL DEFAULT 0,
  last_from BIGINT NOT NULL DEFAULT 0,
  -- plain text of the last message, cut to 120 characters; NULL when it
  -- was recalled or deleted
  preview VARCHAR(160) NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Public profiles (user events `ProfileChanged`, group events
-- `GroupProfileChanged`): names and picture references shown in lists.
CREATE TABLE IF NOT EXISTS im_user_profiles (
  uid BIGINT NOT NULL,
  full_name VARCHAR(128) NULL,
  photo VARCHAR(512) NULL COMMENT 'a reference (URL), never the bytes',
  note VARCHAR(512) NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

ALTER TABLE im_groups
  ADD COLUMN photo VARCHAR(512) NULL COMMENT 'a reference (URL), never the bytes' AFTER name,
  ADD COLUMN description VARCHAR(1024) NULL AFTER photo;
