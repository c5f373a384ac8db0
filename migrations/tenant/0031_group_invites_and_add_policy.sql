-- Consent to membership (issue 30). Pending invitations, projected by the
-- members pipeline from MemberInvited / MemberJoined / MemberInviteDeclined /
-- MemberLeft / GroupDissolved (the group write model in Redis is rebuilt
-- from this table and the log tail), and each user's own setting of who may
-- add them to a group directly (written by the gateway, like logins: it is
-- the user's account data, not a projection of group events).

CREATE TABLE IF NOT EXISTS im_group_invites (
  topic VARBINARY(64) NOT NULL,
  uid BIGINT NOT NULL,
  invited_by BIGINT NOT NULL,
  invited_at DATETIME(3) NOT NULL,
  PRIMARY KEY (topic, uid),
  KEY idx_invites_uid (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_user_settings (
  uid BIGINT NOT NULL,
  add_policy VARCHAR(16) NOT NULL DEFAULT 'anyone' COMMENT 'anyone/contacts/nobody: who may add the user to a group directly',
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
