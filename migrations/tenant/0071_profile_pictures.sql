-- A profile's picture recorded under the profile (issue 41): `topic`
-- `@<owner>` (`@usr<uid>` or `@<group>`), so that a picture replaced by
-- another is released (no longer readable as a picture, then swept after
-- `files.deleted_retention_secs`). The pictures profiles show today are
-- recorded so; their earlier record (`topic` empty) stays until replaced.
INSERT IGNORE INTO im_file_refs (file_id, topic, seq)
  SELECT SUBSTRING_INDEX(SUBSTRING_INDEX(SUBSTRING(p.photo, 12), '?', 1), '#', 1),
         CONCAT('@usr', p.uid), 0
  FROM im_user_profiles p
  WHERE p.photo LIKE '/v0/file/s/%';
INSERT IGNORE INTO im_file_refs (file_id, topic, seq)
  SELECT SUBSTRING_INDEX(SUBSTRING_INDEX(SUBSTRING(g.photo, 12), '?', 1), '#', 1),
         CONCAT('@', g.topic), 0
  FROM im_groups g
  WHERE g.photo LIKE '/v0/file/s/%';
