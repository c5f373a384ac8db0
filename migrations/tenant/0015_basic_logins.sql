-- People who log in with a password (`{login scheme="basic"}` outside
-- development): one row per login, created by `imstream users add`. The
-- password is kept only as an Argon2id PHC string (algorithm, parameters,
-- salt and hash), never in plaintext. Numbered after its issue (15) so the
-- parallel migrations of other work cannot take the same version. Logins
-- compare case-insensitively (Alice and alice are one login).

CREATE TABLE IF NOT EXISTS im_basic_logins (
  login VARCHAR(64) NOT NULL,
  uid BIGINT NOT NULL,
  password_hash VARCHAR(255) NOT NULL,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (login),
  UNIQUE KEY uk_basic_logins_uid (uid),
  CONSTRAINT chk_basic_logins_uid CHECK (uid > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
