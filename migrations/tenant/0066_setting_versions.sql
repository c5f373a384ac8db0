-- The version of each block and each chat mute a user changed last
-- (issue 40). The gateway writes a change through before it answers and
-- the relations projection applies the same event later; a stored version
-- newer than the event's keeps the projection from putting an older block
-- or mute back (a block replayed after the unblock's write-through).
-- `reserved` is the highest version handed out (before its event was
-- produced), so a later change outranks one whose write-through failed,
-- whatever the gateways' clocks say; `version` is the one applied.
CREATE TABLE IF NOT EXISTS im_setting_versions (
  uid BIGINT NOT NULL,
  setting VARCHAR(96) COLLATE utf8mb4_bin NOT NULL COMMENT 'block:<uid>, mute:<topic> or incognito',
  version BIGINT NOT NULL DEFAULT 0 COMMENT 'the event version applied last',
  reserved BIGINT NOT NULL DEFAULT 0 COMMENT 'the highest version handed out',
  PRIMARY KEY (uid, setting)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
