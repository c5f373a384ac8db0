-- group_dump.lua: a group's whole write model as Redis holds it, to write
-- it to MySQL in one piece (an unsynced change whose command did not
-- finish, or a database that lost writes; src/group_model/durable.rs).
--
-- KEYS[1] meta hash   KEYS[2] members set   KEYS[3] roles hash
-- KEYS[4] mutes hash  KEYS[5] invites hash  KEYS[6] left hash
--
-- Returns {'NOTLIVE'} when the model is not this incarnation's or not
-- whole, else {'OK', status, group_id, owner, prev_owner, mute_all,
-- version, epoch, unsynced, unsynced_claim, members (flat list), roles,
-- mutes, invites, left (flat field/value lists)}.
local m = redis.call('HMGET', KEYS[1], 'status', 'group_id', 'owner', 'prev_owner', 'mute_all',
  'version', 'epoch', 'unsynced', 'unsynced_claim', 'inc')
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not m[1] or m[1] == 'none' or not at or m[10] ~= string.sub(info, at + 7, at + 46)
  or redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) ~= 5 then
  return {'NOTLIVE'}
end
return {'OK', m[1], m[2] or '0', m[3] or '', m[4] or '', m[5] or '0', m[6] or '0', m[7] or '0',
  m[8] or '', m[9] or '',
  redis.call('SMEMBERS', KEYS[2]), redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]), redis.call('HGETALL', KEYS[6])}
