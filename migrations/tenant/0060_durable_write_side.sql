-- The write side's durable state (issue 38): what Redis decides with, kept
-- where a Redis that restarts, fails over, comes back older or loses every
-- key cannot take it. Redis stays the place commands are decided and seqs
-- handed out; these rows only make sure nothing it acted on is forgotten
-- (docs/ARCHITECTURE.md §3b).

-- A topic's seq ceiling. Redis hands out seqs only from a block below
-- `mark` that was reserved here first (seqsvr's durable high-water mark),
-- so every seq ever handed out is <= mark: a Redis that forgot restarts at
-- `mark`, without waiting and without reading the log. `month_floor` is
-- the topic's newest shard month (months never go back), `del_mark` the
-- last delete transaction id (Tinode's `clear`) handed out.
CREATE TABLE IF NOT EXISTS im_seq_marks (
  topic VARBINARY(64) NOT NULL,
  mark BIGINT NULL COMMENT 'NULL: no seq handed out under a mark yet',
  month_floor CHAR(6) NOT NULL DEFAULT '',
  del_mark INT NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- A group's write model as every acknowledged command left it, written by
-- the command before it answers. `version` is the model's version in Redis;
-- `epoch` fences writers: every restore of the model into Redis raises it,
-- and a command writes only under the epoch it was applied in.
CREATE TABLE IF NOT EXISTS im_group_models (
  topic VARBINARY(64) NOT NULL,
  group_id BIGINT NOT NULL,
  status VARCHAR(16) NOT NULL COMMENT 'active/dissolved',
  owner_uid BIGINT NOT NULL DEFAULT 0,
  prev_owner_uid BIGINT NOT NULL DEFAULT 0,
  mute_all TINYINT(1) NOT NULL DEFAULT 0,
  version BIGINT NOT NULL,
  epoch BIGINT NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- One user's place in a group's write model: a member (role, mute), an
-- invited user (inviter), and for anyone who left the seq boundary the
-- fan-out uses (left after `left_seq`, back from `back_seq`).
CREATE TABLE IF NOT EXISTS im_group_model_members (
  topic VARBINARY(64) NOT NULL,
  uid BIGINT NOT NULL,
  place VARCHAR(8) NOT NULL COMMENT 'owner/admin/member/invited/out',
  muted_until BIGINT NULL COMMENT 'epoch ms',
  inviter BIGINT NULL,
  left_seq BIGINT NULL,
  back_seq BIGINT NULL,
  PRIMARY KEY (topic, uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- A governance command's claim: what a retry with the same command id is
-- answered, and the events it produces. Written with the model in one
-- transaction; `done` once the events are in the log (a sweep produces
-- those still pending, also when Redis forgot them).
CREATE TABLE IF NOT EXISTS im_group_commands (
  claim_key VARBINARY(300) NOT NULL,
  topic VARBINARY(64) NOT NULL,
  version BIGINT NOT NULL,
  claim MEDIUMTEXT NOT NULL,
  done TINYINT(1) NOT NULL DEFAULT 0,
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (claim_key),
  KEY idx_group_commands_pending (done, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Whether every topic and group of this tenant has had its durable state
-- since its first use: true for a tenant set up by this version (its
-- database was empty when this ran). There, a topic without a seq mark is
-- new and a name without a model row is no group, known without reading
-- the log; a tenant upgraded with data keeps the log-derived recovery for
-- topics and groups that have no row yet (src/send/reseed.rs).
CREATE TABLE IF NOT EXISTS im_write_state (
  id TINYINT NOT NULL,
  complete_since DATETIME(3) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

INSERT INTO im_write_state (id, complete_since)
SELECT 1, CURRENT_TIMESTAMP(3) FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM im_group_message_topic_shards)
  AND NOT EXISTS (SELECT 1 FROM im_groups)
  AND NOT EXISTS (SELECT 1 FROM im_group_messages)
  AND NOT EXISTS (SELECT 1 FROM im_group_message_dedup)
  AND NOT EXISTS (SELECT 1 FROM im_write_state);
