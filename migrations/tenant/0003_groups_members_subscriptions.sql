-- Groups, members and per-member cursors, projected from membership and
-- receipt events (seed 001 §5.2, seed 003 read/recv cursors).

CREATE TABLE IF NOT EXISTS im_groups (
  topic VARCHAR(64) NOT NULL,
  group_id BIGINT NOT NULL,
  name VARCHAR(128) NOT NULL DEFAULT '',
  owner_uid BIGINT NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'active' COMMENT 'active/dissolved',
  mute_all TINYINT(1) NOT NULL DEFAULT 0,
  member_count INT NOT NULL DEFAULT 0,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic),
  UNIQUE KEY uk_group_id (group_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_group_members (
  topic VARCHAR(64) NOT NULL,
  uid BIGINT NOT NULL,
  role VARCHAR(16) NOT NULL DEFAULT 'member' COMMENT 'owner/admin/member',
  muted_until DATETIME(3) NULL,
  joined_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, uid),
  KEY idx_uid (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_subscriptions (
  topic VARCHAR(64) NOT NULL,
  uid BIGINT NOT NULL,
  read_seq BIGINT NOT NULL DEFAULT 0,
  recv_seq BIGINT NOT NULL DEFAULT 0,
  clear_delid INT NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, uid),
  KEY idx_uid (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
