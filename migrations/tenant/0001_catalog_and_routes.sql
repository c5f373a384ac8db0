-- Month catalog, topic route mirror and cross-month dedup (seed 000 §3.2, §3.4, §3.5).
-- Monthly message tables are not migrations: the shard manager creates them
-- from one template (src/store/month_table.rs).

CREATE TABLE IF NOT EXISTS im_group_message_shards (
  shard_month CHAR(6) NOT NULL COMMENT 'UTC month YYYYMM',
  table_name VARCHAR(64) NOT NULL,
  shard_start DATETIME(3) NOT NULL,
  shard_end DATETIME(3) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'prepared' COMMENT 'prepared/writable/sealing/sealed/archived',
  row_count BIGINT NOT NULL DEFAULT 0,
  min_created_at DATETIME(3) NULL,
  max_created_at DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (shard_month),
  UNIQUE KEY uk_table_name (table_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_group_message_topic_shards (
  topic VARCHAR(64) NOT NULL,
  shard_month CHAR(6) NOT NULL,
  min_seq BIGINT NOT NULL,
  max_seq BIGINT NOT NULL,
  message_count BIGINT NOT NULL DEFAULT 0,
  min_created_at DATETIME(3) NOT NULL,
  max_created_at DATETIME(3) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, shard_month),
  KEY idx_topic_max_seq (topic, max_seq),
  KEY idx_month_topic (shard_month, topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_group_message_dedup (
  topic VARCHAR(64) NOT NULL,
  from_user BIGINT NOT NULL,
  client_msg_id VARCHAR(64) NOT NULL,
  seqid BIGINT NOT NULL,
  shard_month CHAR(6) NOT NULL,
  message_id BIGINT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'pending',
  expires_at DATETIME(3) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, from_user, client_msg_id),
  KEY idx_expires (expires_at),
  KEY idx_topic_seq (topic, seqid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
