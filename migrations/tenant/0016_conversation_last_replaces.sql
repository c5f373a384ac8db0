-- The seq the topic's last message replaces when it is an edit (Tinode's
-- head.replace), so that recalling or deleting the original also withdraws
-- the edited text from the chat list's preview. 0: not an edit.
ALTER TABLE im_conversation_topics
  ADD COLUMN last_replaces BIGINT NOT NULL DEFAULT 0 AFTER last_from;
