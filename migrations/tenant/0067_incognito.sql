-- Users who hide when they are online (Tinode's incognito: a `me` want
-- without P), projected from IncognitoChanged by the relations pipeline
-- and written through by the gateway, versioned in im_setting_versions
-- (`incognito`). A row: hidden.
CREATE TABLE IF NOT EXISTS im_incognito (
  uid BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
