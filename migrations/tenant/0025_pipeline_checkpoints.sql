-- Where each MySQL projection stands in this database (issue 29): the next
-- offset of each source partition the pipeline has handled, written after
-- the batch's own writes. A database that comes back older (a lagging
-- replica promoted, a restore) comes back with older checkpoints, and the
-- pipeline handles those partitions again from there
-- (src/pipeline/checkpoints.rs).

CREATE TABLE IF NOT EXISTS im_pipeline_checkpoints (
  consumer_group VARBINARY(255) NOT NULL,
  source_topic VARBINARY(255) NOT NULL,
  kafka_partition INT NOT NULL,
  next_offset BIGINT NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (consumer_group, source_topic, kafka_partition)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
