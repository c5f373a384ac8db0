-- File audit (seed 002 §7.2 `file.audit.update`, issue 32): an operator's
-- verdict on a file message of a conversation, kept beside its row of the
-- files reference table by the references pipeline (event
-- FileAuditUpdated). `blocked`: the conversation's file list shows the
-- entry without its file (name, size, link); the message itself stays in
-- history (removing it is `message.moderate`).
ALTER TABLE im_group_files
  ADD COLUMN audit VARCHAR(16) NOT NULL DEFAULT 'ok' COMMENT 'ok or blocked',
  ADD COLUMN audited_by VARCHAR(64) NULL COMMENT 'name of the admin token',
  ADD COLUMN audited_at DATETIME(3) NULL;
