-- group_apply.lua: one governance command's change to one group's write
-- model, atomically, only if the facts the command was decided on still
-- hold (see src/group_model/mod.rs). Two commands that race are decided
-- in turn: the second sees the first's change, or is told CONFLICT and is
-- decided again on the new state.
--
-- The change is not durable until the command has written it to MySQL
-- (src/group_model/durable.rs): until then the model is `unsynced` at the
-- new version, and no other change is applied on top of it (UNSYNCED: the
-- caller finishes that command first). So MySQL holds the model exactly as
-- some version of Redis had it, never half of one.
--
-- KEYS[1] meta hash   KEYS[2] members set   KEYS[3] roles hash
-- KEYS[4] mutes hash  KEYS[5] invites hash  KEYS[6] left hash
-- KEYS[7] the topic's seq hash (read only: the left boundary)
-- KEYS[8] the command's claim
-- ARGV[1] the claim to record with the change ('' for none)
-- ARGV[2] claim TTL, ms
-- ARGV[3] the status the group must have: 'active', or 'none' for a create
-- ARGV[4] n checks, then n pairs: uid, standing (as group_read.lua names it)
-- then m ops, then m triplets: op, a, b
--   create   group_id owner  the group begins: active, its owner alone
--   join     uid role        a member ('member' | 'admin' | 'owner'); an
--                            invitation is used up
--   leave    uid -           no longer a member: records the left boundary
--   role     uid role        ('member' drops the role)
--   owner    uid -           owner := uid, prev_owner := the owner before
--   mute     uid until       ('' lifts the mute)
--   muteall  v -             ('1' | '0')
--   invite   uid inviter
--   uninvite uid -
--   dissolve - -
--
-- Returns one of
--   {'OK', version, epoch, status, group_id, owner, prev_owner, mute_all,
--    n, then n rows of the users the change touched, each
--    uid, place ('owner'|'admin'|'member'|'invited'|'out'), muted_until,
--    inviter, left ('from|back' or '')}
--   {'CLAIM', claim} | {'CONFLICT'} | {'MISSING'} | {'FENCED'}
--   {'UNSYNCED', version, claim key}  an earlier change is not durable yet
if ARGV[1] ~= '' then
  local claim = redis.call('GET', KEYS[8])
  if claim then
    return {'CLAIM', claim}
  end
end
local m = redis.call('HMGET', KEYS[1], 'status', 'inc', 'owner', 'epoch', 'unsynced', 'unsynced_claim')
if not m[1] then
  return {'MISSING'}
end
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not at or m[2] ~= string.sub(info, at + 7, at + 46) then
  return {'FENCED'}
end
if m[1] ~= 'none' and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) ~= 5 then
  return {'MISSING'}
end
if m[5] then
  return {'UNSYNCED', m[5], m[6] or ''}
end
if m[1] ~= ARGV[3] then
  return {'CONFLICT'}
end

local function standing(uid)
  if redis.call('SISMEMBER', KEYS[2], uid) == 1 then
    return redis.call('HGET', KEYS[3], uid) or 'member'
  elseif redis.call('HEXISTS', KEYS[5], uid) == 1 then
    return 'invited'
  end
  return '-'
end

local i = 4
local n = tonumber(ARGV[i])
for _ = 1, n do
  if standing(ARGV[i + 1]) ~= ARGV[i + 2] then
    return {'CONFLICT'}
  end
  i = i + 2
end

local touched, order = {}, {}
local function touch(uid)
  if uid and uid ~= '' and uid ~= '-' and not touched[uid] then
    touched[uid] = true
    order[#order + 1] = uid
  end
end

local last_seq = redis.call('HGET', KEYS[7], 'last_seq') or '0'
i = i + 1
local ops = tonumber(ARGV[i])
for _ = 1, ops do
  local op, a, b = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  i = i + 3
  if op == 'create' then
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
    redis.call('SADD', KEYS[2], '-', b)
    redis.call('HSET', KEYS[3], '-', '-', b, 'owner')
    redis.call('HSET', KEYS[4], '-', '-')
    redis.call('HSET', KEYS[5], '-', '-')
    redis.call('HSET', KEYS[6], '-', '-')
    redis.call('HSET', KEYS[1], 'group_id', a, 'status', 'active', 'owner', b, 'prev_owner', '', 'mute_all', '0')
    redis.call('PERSIST', KEYS[1])
    touch(b)
  elseif op == 'join' then
    redis.call('SADD', KEYS[2], a)
    if b == 'member' then
      redis.call('HDEL', KEYS[3], a)
    else
      redis.call('HSET', KEYS[3], a, b)
    end
    redis.call('HDEL', KEYS[5], a)
    local left = redis.call('HGET', KEYS[6], a)
    if left then
      local from = string.match(left, '^([^|]*)')
      redis.call('HSET', KEYS[6], a, from .. '|' .. last_seq)
    end
    touch(a)
  elseif op == 'leave' then
    redis.call('SREM', KEYS[2], a)
    redis.call('HDEL', KEYS[3], a)
    redis.call('HDEL', KEYS[4], a)
    redis.call('HDEL', KEYS[5], a)
    redis.call('HSET', KEYS[6], a, last_seq .. '|')
    touch(a)
  elseif op == 'role' then
    if b == 'member' then
      redis.call('HDEL', KEYS[3], a)
    else
      redis.call('HSET', KEYS[3], a, b)
    end
    touch(a)
  elseif op == 'owner' then
    redis.call('HSET', KEYS[1], 'prev_owner', redis.call('HGET', KEYS[1], 'owner') or '', 'owner', a)
  elseif op == 'mute' then
    if b == '' then
      redis.call('HDEL', KEYS[4], a)
    else
      redis.call('HSET', KEYS[4], a, b)
    end
    touch(a)
  elseif op == 'muteall' then
    redis.call('HSET', KEYS[1], 'mute_all', a)
  elseif op == 'invite' then
    redis.call('HSET', KEYS[5], a, b)
    touch(a)
  elseif op == 'uninvite' then
    redis.call('HDEL', KEYS[5], a)
    touch(a)
  elseif op == 'dissolve' then
    redis.call('HSET', KEYS[1], 'status', 'dissolved')
    for _, uid in ipairs(redis.call('HKEYS', KEYS[5])) do
      touch(uid)
    end
    redis.call('DEL', KEYS[5])
    redis.call('HSET', KEYS[5], '-', '-')
  else
    return redis.error_reply('group_apply: unknown op ' .. tostring(op))
  end
end
-- A group that exists for good is never dropped by a TTL.
redis.call('PERSIST', KEYS[2])
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'unsynced', version, 'unsynced_claim', KEYS[8])
if ARGV[1] ~= '' then
  redis.call('SET', KEYS[8], ARGV[1], 'PX', ARGV[2])
end

local meta = redis.call('HMGET', KEYS[1], 'status', 'group_id', 'owner', 'prev_owner', 'mute_all', 'epoch')
local out = {'OK', version, meta[6] or '0', meta[1], meta[2] or '0', meta[3] or '', meta[4] or '', meta[5] or '0', #order}
for _, uid in ipairs(order) do
  local place, muted, inviter = 'out', '', ''
  if redis.call('SISMEMBER', KEYS[2], uid) == 1 then
    place = redis.call('HGET', KEYS[3], uid) or 'member'
    muted = redis.call('HGET', KEYS[4], uid) or ''
  else
    local by = redis.call('HGET', KEYS[5], uid)
    if by then
      place, inviter = 'invited', by
    end
  end
  out[#out + 1] = uid
  out[#out + 1] = place
  out[#out + 1] = muted
  out[#out + 1] = inviter
  out[#out + 1] = redis.call('HGET', KEYS[6], uid) or ''
end
return out
