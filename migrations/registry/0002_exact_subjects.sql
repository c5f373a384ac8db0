-- Exact subject names (issue 28): `utf8mb4_bin` compares code points but pads
-- (`'orders-value'` and `'orders-value '` were one subject); VARBINARY compares
-- bytes with no padding in MariaDB and MySQL 8 alike. 1020 bytes: the old
-- 255 characters of up to 4 bytes each.

ALTER TABLE sr_subject_versions
  MODIFY COLUMN subject VARBINARY(1020) NOT NULL;

ALTER TABLE sr_config
  MODIFY COLUMN subject VARBINARY(1020) NOT NULL COMMENT 'empty string = global';
