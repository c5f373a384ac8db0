-- The directory search (`fnd`, issue 28) matches name prefixes through
-- this index: a range scan in name order that stops after 20 rows, never a
-- `LIKE '%term%'` scan of every profile.
ALTER TABLE im_user_profiles ADD KEY idx_profiles_full_name (full_name);
