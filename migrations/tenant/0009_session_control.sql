-- Session control (seed 002 §5) as ground truth: the control pipeline
-- writes these rows first, then the Redis control keys; a gateway that
-- finds a user's keys missing (a Redis loss) rebuilds them from here.

CREATE TABLE IF NOT EXISTS im_session_control_users (
  uid BIGINT NOT NULL,
  version BIGINT NOT NULL COMMENT 'bumped by every change; a Redis rebuild never overwrites a newer one',
  auth_version BIGINT NOT NULL DEFAULT 0 COMMENT 'tokens with an older av are refused',
  disabled TINYINT(1) NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS im_session_control_devices (
  uid BIGINT NOT NULL,
  device VARCHAR(191) NOT NULL,
  generation BIGINT NOT NULL COMMENT 'tokens of the device with an older gen are refused',
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid, device)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
