-- The consistency checker's record (seed 000 §3.4 item 4, §12 item 16;
-- issue 32): every difference it repaired between a month table, the MySQL
-- route mirror and the Redis route, what it found and what it wrote, and an
-- operator's reopening of a sealed month. Written before (Redis) or with
-- (MySQL, same transaction) the repair itself, so no repair goes unrecorded.
CREATE TABLE IF NOT EXISTS im_consistency_repairs (
  id BIGINT NOT NULL AUTO_INCREMENT,
  repaired_at DATETIME(3) NOT NULL,
  topic VARBINARY(64) NOT NULL,
  shard_month CHAR(6) NOT NULL,
  kind VARCHAR(32) NOT NULL COMMENT 'mirror_missing, mirror_wrong, mirror_orphan, redis_route, month_reopened',
  found VARCHAR(512) NOT NULL COMMENT 'what was there',
  repaired_to VARCHAR(512) NOT NULL COMMENT 'what it became',
  source VARCHAR(32) NOT NULL COMMENT 'month_table, mirror or operator',
  PRIMARY KEY (id),
  KEY idx_repairs_time (repaired_at),
  KEY idx_repairs_topic (topic, shard_month)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
