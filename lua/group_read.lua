-- group_read.lua: what a command (or a membership check) needs from one
-- group's write model, read atomically, and whether that model may be used
-- at all (see src/group_model/mod.rs).
--
-- KEYS[1] meta hash   KEYS[2] members set   KEYS[3] roles hash
-- KEYS[4] mutes hash  KEYS[5] invites hash  KEYS[6] a command's claim
-- KEYS[7] left hash   KEYS[8] the name's "no such group" marker
-- ARGV[1] '1': answer the command's claim first, when it has one
-- ARGV[2..] uids whose standing is wanted
--
-- Returns one of:
--   {'CLAIM', claim}   the command ran before: its recorded outcome
--   {'ABSENT'}         no such group (known for a while: KEYS[8])
--   {'MISSING'}        no model, or a part of it is gone (a new name, or
--                      Redis lost it, wholly or in part): restore it
--   {'FENCED', inc}    written by another incarnation of Redis (a restart,
--                      a promoted replica): it may be older than what was
--                      acknowledged, so it is restored before any use
--   {'OK', status, version, group_id, owner, prev_owner, mute_all,
--          then per uid: standing, muted_until of a member ('' for none)
--          or the inviter of an invited user}
--   standing: 'owner' | 'admin' | 'member' | 'invited' | '-'
if ARGV[1] == '1' then
  local claim = redis.call('GET', KEYS[6])
  if claim then
    return {'CLAIM', claim}
  end
end
local m = redis.call('HMGET', KEYS[1], 'status', 'version', 'group_id', 'owner', 'prev_owner', 'mute_all', 'inc')
if not m[1] then
  if redis.call('EXISTS', KEYS[8]) == 1 then
    return {'ABSENT'}
  end
  return {'MISSING'}
end
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not at or m[7] ~= string.sub(info, at + 7, at + 46) then
  return {'FENCED', m[7] or ''}
end
-- A group's model is one unit: every part holds a placeholder, so a part
-- that is missing was lost on its own (evicted, deleted) and the model
-- is restored rather than decided on.
if m[1] ~= 'none' and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7]) ~= 5 then
  return {'MISSING'}
end
local out = {'OK', m[1], m[2] or '0', m[3] or '0', m[4] or '', m[5] or '', m[6] or '0'}
for i = 2, #ARGV do
  local uid = ARGV[i]
  local standing, extra = '-', ''
  if redis.call('SISMEMBER', KEYS[2], uid) == 1 then
    standing = redis.call('HGET', KEYS[3], uid) or 'member'
    extra = redis.call('HGET', KEYS[4], uid) or ''
  else
    local inviter = redis.call('HGET', KEYS[5], uid)
    if inviter then
      standing, extra = 'invited', inviter
    end
  end
  out[#out + 1] = standing
  out[#out + 1] = extra
end
return out
