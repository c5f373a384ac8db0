-- Seq collisions (issue 29): the store found `(topic, seq)` already held by a
-- different message. That is an acknowledged message about to be lost (its
-- seq was handed out twice, e.g. by a Redis that came back older than what it
-- had acknowledged), so the second message is never dropped: it is kept here
-- whole, with the message that holds its seq, for an operator to see
-- (`imstream_store_seq_collisions_total`, the `SeqCollision` alert, an error
-- log with both ids) and repair. A redelivery of the same event changes
-- nothing (keyed by its message id).

CREATE TABLE IF NOT EXISTS im_seq_collisions (
  message_id BIGINT NOT NULL COMMENT 'the message that found its seq taken',
  topic VARBINARY(64) NOT NULL,
  seqid BIGINT NOT NULL,
  shard_month CHAR(6) NOT NULL,
  held_by_message_id BIGINT NOT NULL COMMENT 'the message stored at (topic, seq)',
  event_id VARBINARY(64) NOT NULL,
  from_user BIGINT NOT NULL,
  client_msg_id VARBINARY(256) NULL,
  msg_type VARCHAR(32) NOT NULL,
  content JSON NULL,
  head JSON NULL,
  created_at DATETIME(3) NOT NULL,
  detected_at DATETIME(3) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'open' COMMENT 'open/repaired',
  PRIMARY KEY (message_id),
  KEY idx_collisions_topic_seq (topic, seqid),
  KEY idx_collisions_status (status, detected_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
