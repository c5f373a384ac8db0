-- A picture may be stored inline (issue 40): Tinode's web app sends a small
-- avatar as bytes (`public.photo.data`, at most 4 KiB before base64) and
-- the gateway keeps it as a `data:image/…;base64,` URI, served to every
-- reader like a reference. Larger pictures go through the file upload.
ALTER TABLE im_user_profiles
  MODIFY COLUMN photo VARCHAR(8192) NULL COMMENT 'a reference (URL) or a small data:image URI';
ALTER TABLE im_groups
  MODIFY COLUMN photo VARCHAR(8192) NULL COMMENT 'a reference (URL) or a small data:image URI';
