-- group_install.lua: installs a group's write model rebuilt from MySQL and
-- the log (src/group_model/rebuild.rs), stamped with the incarnation of
-- Redis that holds it now, but only if the model is still what the rebuild
-- saw when it began (none, or the same stale incarnation): a model that a
-- command or another rebuild wrote meanwhile is kept.
--
-- KEYS[1] meta hash   KEYS[2] members set   KEYS[3] roles hash
-- KEYS[4] mutes hash  KEYS[5] invites hash
-- ARGV[1] the incarnation the rebuild saw ('' when there was no model)
-- ARGV[2] TTL in ms of a group that does not exist ('none'); 0 otherwise
-- ARGV[3] status   ARGV[4] group_id   ARGV[5] owner   ARGV[6] prev_owner
-- ARGV[7] mute_all ('1' | '0')   ARGV[8] placeholder member
-- ARGV[9] n members, then n triplets: uid, role ('' member), muted_until ('')
-- then k invitations, then k pairs: uid, inviter
--
-- Returns 1 when installed, 0 when kept.
local m = redis.call('HMGET', KEYS[1], 'status', 'inc', 'version')
local present = m[1] and redis.call('EXISTS', KEYS[2]) == 1
if ARGV[1] == '' then
  if present then
    return 0
  end
elseif not present or m[2] ~= ARGV[1] then
  return 0
end
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local run_id = at and string.sub(info, at + 7, at + 46) or ''
local version = (tonumber(m[3]) or 0) + 1
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SADD', KEYS[2], ARGV[8])
local i = 10
for _ = 1, tonumber(ARGV[9]) do
  redis.call('SADD', KEYS[2], ARGV[i])
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
  if ARGV[i + 2] ~= '' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
  end
  i = i + 3
end
local k = tonumber(ARGV[i])
for _ = 1, k do
  redis.call('HSET', KEYS[5], ARGV[i + 1], ARGV[i + 2])
  i = i + 2
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'group_id', ARGV[4], 'owner', ARGV[5],
  'prev_owner', ARGV[6], 'mute_all', ARGV[7], 'version', version, 'inc', run_id)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
