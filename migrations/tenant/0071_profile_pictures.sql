-- A profile's picture recorded under the profile (issue 41): `topic`
-- `@<owner>` (`@usr<uid>` or `@<group>`, a group's name up to 64 bytes:
-- the column widens), so that a picture replaced by another is released
-- (no longer readable as a picture, then swept after
-- `files.deleted_retention_secs`). The pictures profiles show today are
-- recorded so (the 26-character id after `/v0/file/s/`, an extension or a
-- query after it ignored; only ids of files this tenant keeps); their
-- earlier record (`topic` empty) stays until replaced.
ALTER TABLE im_file_refs
  MODIFY COLUMN topic VARBINARY(80) NOT NULL;
INSERT IGNORE INTO im_file_refs (file_id, topic, seq)
  SELECT f.file_id, CONCAT('@usr', p.uid), 0
  FROM im_user_profiles p
  JOIN im_files f ON f.file_id = CAST(SUBSTRING(p.photo, 12, 26) AS BINARY)
  WHERE p.photo LIKE '/v0/file/s/%' AND f.state IN ('stored', 'unavailable');
INSERT IGNORE INTO im_file_refs (file_id, topic, seq)
  SELECT f.file_id, CONCAT('@', g.topic), 0
  FROM im_groups g
  JOIN im_files f ON f.file_id = CAST(SUBSTRING(g.photo, 12, 26) AS BINARY)
  WHERE g.photo LIKE '/v0/file/s/%' AND f.state IN ('stored', 'unavailable');
