-- A user's own settings of one chat (issue 40), projected from the user
-- events' `ChatSettingsChanged` by the relations pipeline (and written
-- through by the gateway before it answers): hidden from their list up to
-- a seq (a one-to-one chat the user deleted; a later message shows it
-- again), and Tinode's `private` object (the web app's archive flag).
CREATE TABLE IF NOT EXISTS im_chat_settings (
  uid BIGINT NOT NULL,
  topic VARCHAR(64) NOT NULL,
  hidden_until_seq BIGINT NOT NULL DEFAULT 0,
  private VARCHAR(2048) NULL COMMENT 'a JSON object (fields::CHAT_PRIVATE_CHARS)',
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid, topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
