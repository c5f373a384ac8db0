-- group_restore.lua: puts a group's write model back from its durable copy
-- (src/group_model/durable.rs; a one-to-one topic's is made from its name),
-- stamped with this incarnation of Redis and the restore's epoch. A model
-- that is live (this incarnation's, whole) is kept unless its epoch is
-- older than this restore's: a later restore has read MySQL after it.
--
-- KEYS[1] meta hash   KEYS[2] members set   KEYS[3] roles hash
-- KEYS[4] mutes hash  KEYS[5] invites hash  KEYS[6] left hash
-- KEYS[7] the name's "no such group" marker (cleared)
-- ARGV[1] mode:
--   'restamp'  only when Redis holds this very version, whole and synced:
--              the model is stamped (incarnation, epoch) and kept as it is
--   'model'    the whole model from the arguments below
--   'none'     a `none` marker (a create is about to decide on the name):
--              meta only, with a TTL, only when there is no model at all
-- ARGV[2] TTL in ms of a `none` marker
-- ARGV[3] status   ARGV[4] group_id   ARGV[5] owner   ARGV[6] prev_owner
-- ARGV[7] mute_all ('1' | '0')   ARGV[8] version   ARGV[9] epoch
-- ARGV[10] n members, then n triplets: uid, role ('' member), muted_until
-- then k invitations, then k pairs: uid, inviter
-- then l departures, then l pairs: uid, 'from|back'
--
-- Returns 1 when installed, 0 when a live model was kept, -1 when a
-- restamp was not possible (the caller installs the whole model).
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not at then
  return redis.error_reply('no run_id in INFO server')
end
local run_id = string.sub(info, at + 7, at + 46)
local m = redis.call('HMGET', KEYS[1], 'status', 'inc', 'epoch', 'version', 'unsynced')
local whole = m[1] == 'none' or redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) == 5
local live = m[1] and m[2] == run_id and whole
local mode = ARGV[1]

if mode == 'none' then
  if m[1] and live then
    return 0
  end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
  redis.call('HSET', KEYS[1], 'status', 'none', 'version', 0, 'epoch', 0, 'inc', run_id)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end

local epoch = tonumber(ARGV[9])
if live and tonumber(m[3] or '0') >= epoch then
  return 0
end
if mode == 'restamp' then
  if m[1] and m[1] ~= 'none' and whole and not m[5] and m[4] == ARGV[8] then
    redis.call('HSET', KEYS[1], 'inc', run_id, 'epoch', epoch)
    redis.call('DEL', KEYS[7])
    return 1
  end
  return -1
end

redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('SADD', KEYS[2], '-')
redis.call('HSET', KEYS[3], '-', '-')
redis.call('HSET', KEYS[4], '-', '-')
redis.call('HSET', KEYS[5], '-', '-')
redis.call('HSET', KEYS[6], '-', '-')
local i = 11
for _ = 1, tonumber(ARGV[10]) do
  redis.call('SADD', KEYS[2], ARGV[i])
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
  if ARGV[i + 2] ~= '' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
  end
  i = i + 3
end
for _ = 1, tonumber(ARGV[i]) do
  redis.call('HSET', KEYS[5], ARGV[i + 1], ARGV[i + 2])
  i = i + 2
end
for _ = 1, tonumber(ARGV[i]) do
  redis.call('HSET', KEYS[6], ARGV[i + 1], ARGV[i + 2])
  i = i + 2
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'group_id', ARGV[4], 'owner', ARGV[5],
  'prev_owner', ARGV[6], 'mute_all', ARGV[7], 'version', ARGV[8], 'epoch', epoch, 'inc', run_id)
return 1
