-- Files whose last message reference went (recalled, deleted for everyone,
-- moderated) wait `files.deleted_retention_secs` in `delete_after`, then
-- the shard manager's sweep removes them (issue 41). Looked up by time.
ALTER TABLE im_files
  ADD KEY idx_delete_after (delete_after);
