-- Who made a file unavailable (issue 41): `scan` (the scan pipeline
-- flagged its bytes: final) or `audit` (an operator's `file.audit.update`
-- blocked a message carrying it: an `ok` audit of that message makes it
-- available again). Empty while it is available.
ALTER TABLE im_files
  ADD COLUMN unavailable_by VARCHAR(16) NOT NULL DEFAULT ''
  COMMENT 'scan / audit: who made it unavailable';
