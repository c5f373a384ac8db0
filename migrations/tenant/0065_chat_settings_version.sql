-- Each user's settings of a chat carry a version, one more with every
-- change (taken under the user's settings lock, so in log order): the
-- projection replaying an older event never overwrites a newer row the
-- gateway wrote through before it answered.
ALTER TABLE im_chat_settings
  ADD COLUMN version BIGINT NOT NULL DEFAULT 0
  COMMENT 'the ChatSettingsChanged version written last';
