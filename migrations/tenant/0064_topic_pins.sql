-- A chat's pinned messages (issue 40: Tinode's `aux.pins`), projected from
-- the group events' `PinsChanged` by the store pipeline (and written
-- through by the gateway before it answers): a JSON array of seqs, newest
-- pin first, at most `pins::MAX_PINS`.
CREATE TABLE IF NOT EXISTS im_topic_pins (
  topic VARCHAR(64) NOT NULL,
  pins VARCHAR(256) NOT NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
