-- Whether a user took part in a conversation of their own accord (issue 39):
-- sent a message there, created the group, or joined it themselves
-- (accepted an invitation). Only then does sharing the conversation show
-- the user's private note and exact presence to the other members: an
-- unsolicited first message, or being added to a stranger's group, no
-- longer unlocks them. Written by the conversations projection from the
-- log; rows from before this column count as engaged (they were shown).
ALTER TABLE im_conversations
  ADD COLUMN engaged TINYINT(1) NOT NULL DEFAULT 0
  COMMENT '1: the user sent, created or joined here themselves';
UPDATE im_conversations SET engaged = 1;
