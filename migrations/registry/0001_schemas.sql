-- Storage of the embedded Confluent-compatible schema registry.

CREATE TABLE IF NOT EXISTS sr_schemas (
  id INT NOT NULL AUTO_INCREMENT,
  schema_type VARCHAR(16) NOT NULL DEFAULT 'AVRO',
  fingerprint CHAR(64) NOT NULL COMMENT 'sha256 of the normalized schema',
  schema_text MEDIUMTEXT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_fingerprint (schema_type, fingerprint)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS sr_subject_versions (
  subject VARCHAR(255) NOT NULL,
  version INT NOT NULL,
  schema_id INT NOT NULL,
  deleted TINYINT(1) NOT NULL DEFAULT 0,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (subject, version),
  KEY idx_schema (schema_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS sr_config (
  subject VARCHAR(255) NOT NULL COMMENT 'empty string = global',
  compatibility VARCHAR(32) NOT NULL,
  PRIMARY KEY (subject)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
