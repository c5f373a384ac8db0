-- A user's system notifications with their read state (issue 32, seed 002
-- §5 and §10 item 6): operator notices, friend requests and their
-- acceptance (relations pipeline, from user events), an invitation to a
-- group, being added to or
-- removed from a group, a new role, a mute, and the outcome of one's report
-- (notifications pipeline, from group events). One row per (uid,
-- notification_id) — the event id or the operator's id — so replays write
-- nothing twice and never reset a read state; `id` orders a user's list
-- (newest first) and is its cursor. Reading is the NotificationsRead user
-- event. A user keeps the newest 500 (src/notifications.rs).

CREATE TABLE IF NOT EXISTS im_user_notifications (
  id BIGINT NOT NULL AUTO_INCREMENT,
  uid BIGINT NOT NULL,
  notification_id VARBINARY(64) NOT NULL,
  kind VARCHAR(32) NOT NULL COMMENT 'system, friend.request, friend.accepted, group.invited, group.added, group.removed, group.role, group.muted, report.resolved',
  actor_uid BIGINT NOT NULL DEFAULT 0 COMMENT 'who caused it; 0 for the system or an operator',
  topic VARBINARY(64) NULL,
  title VARCHAR(256) NOT NULL DEFAULT '',
  body VARCHAR(2048) NOT NULL DEFAULT '',
  params JSON NULL,
  created_at DATETIME(3) NOT NULL,
  read_at DATETIME(3) NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_user_notification (uid, notification_id),
  KEY idx_user_id (uid, id),
  KEY idx_user_unread (uid, read_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
