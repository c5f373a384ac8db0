-- The replica lag probe: gateways write the time on a tenant's primary and
-- read it back from its read replica (tenants[].mysql_read_url); how far
-- behind the replica's copy is, is how far behind the replica is. One row.
CREATE TABLE IF NOT EXISTS im_replica_heartbeat (
  id TINYINT NOT NULL,
  beat_ms BIGINT NOT NULL COMMENT 'epoch ms, written on the primary',
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
