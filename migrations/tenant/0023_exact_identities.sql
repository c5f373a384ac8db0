-- Exact identities (issue 28). Every column that holds an identity -- a topic
-- name, a client message id, an event or command id, a device id, a login, a
-- report id -- compares bytes exactly: VARBINARY, which MariaDB and MySQL 8
-- both compare byte for byte with no padding (`'a' <> 'a '`), unlike the
-- tables' default `utf8mb4_unicode_ci` (case- and accent-insensitive: one-to-one
-- topic names are base64, so `p2pUQ…CwB…` and `p2pUQ…CWB…` were one key and one
-- user could read and write another pair's conversation). Text that is only
-- shown (names, previews, reasons) keeps the table default.
--
-- Widths are in bytes: names imstream builds (topics, event ids, report ids)
-- are ASCII; names a client chooses keep room for the old column's width in
-- characters (4 bytes each). Stored bytes do not change (utf8mb4 text is its
-- UTF-8 bytes), and two rows that differed only in case stay two rows: the
-- unique keys become exact with their columns. Month tables are converted by
-- `imstream migrate` itself (their names are not known here; see
-- `src/exact.rs`), and every process refuses a tenant database whose identity
-- columns are not exact, naming the column.

ALTER TABLE im_group_message_topic_shards
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_group_message_dedup
  MODIFY COLUMN topic VARBINARY(64) NOT NULL,
  MODIFY COLUMN client_msg_id VARBINARY(256) NOT NULL;

ALTER TABLE im_dellog
  MODIFY COLUMN topic VARBINARY(64) NOT NULL,
  MODIFY COLUMN event_id VARBINARY(64) NULL COMMENT 'event that produced the range; replays are idempotent';

ALTER TABLE im_message_revisions
  MODIFY COLUMN topic VARBINARY(64) NOT NULL,
  MODIFY COLUMN event_id VARBINARY(64) NOT NULL;

ALTER TABLE im_groups
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_group_members
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_subscriptions
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_group_messages
  MODIFY COLUMN topic VARBINARY(64) NOT NULL,
  MODIFY COLUMN client_msg_id VARBINARY(256) NULL;

ALTER TABLE im_admin_commands
  MODIFY COLUMN command_id VARBINARY(256) NOT NULL,
  MODIFY COLUMN operator VARBINARY(256) NOT NULL;

ALTER TABLE im_push_muted_topics
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_conversations
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_conversation_topics
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_session_control_devices
  MODIFY COLUMN device VARBINARY(764) NOT NULL;

ALTER TABLE im_basic_logins
  MODIFY COLUMN login VARBINARY(256) NOT NULL;

ALTER TABLE im_stats_daily
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_stats_senders
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_message_reports
  MODIFY COLUMN report_id VARBINARY(120) NOT NULL,
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_favorites
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;

ALTER TABLE im_group_files
  MODIFY COLUMN topic VARBINARY(64) NOT NULL;
