-- allocate_seq.lua: one atomic step of the send path (ARCHITECTURE.md §3).
--
-- Checks the sender against the group's write model (status, membership,
-- mutes: src/group_model, the same state every governance command changes),
-- claims the client message id, allocates the next seq and picks the
-- message's shard month, so that per-topic month segments never overlap and
-- never go back. The sender is checked before the seq state is even looked
-- at: a refused send (a made-up topic, a non-member, a muted member) never
-- leads to a re-seed, so it leaves no state behind and costs no log scan.
--
-- KEYS[1] seq hash     (last_seq, month_floor)
-- KEYS[2] meta hash    (group_id, status, mute_all, inc)
-- KEYS[3] members set
-- KEYS[4] roles hash   (uid -> owner|admin)
-- KEYS[5] mutes hash   (uid -> muted-until epoch ms)
-- KEYS[6] uniq claim   (only read/written when ARGV[5] ~= '')
-- KEYS[7] the tenant's active month      (one Redis server only, see below)
-- KEYS[8] the tenant's announced switch  (one Redis server only)
-- ARGV[1] uid
-- ARGV[2] active month YYYYMM as the gateway read it ('' with KEYS[7])
-- ARGV[3] now, epoch ms
-- ARGV[4] pending claim TTL, ms
-- ARGV[5] client message id ('' for none)
-- ARGV[6] message id (Snowflake) to record in the claim
-- ARGV[7] event id to record in the claim
-- ARGV[8] created_at, epoch ms, to record in the claim
-- ARGV[9] digest of the message (content, head, edit target)
-- ARGV[10] announced switch 'YYYYMM@epoch_ms' as the gateway read it
--          ('' for none, or with KEYS[8])
--
-- The month (seed 000 §2.1: the script decides it, one month for every
-- node at once). The shard manager switches a tenant's month in two
-- steps: it announces 'next@T' (T = Redis TIME + 2 s, more than the 1 s a
-- gateway caches what it read), waits until T, then sets the active month
-- and removes the announcement. The month of a message is the active month,
-- or the announced one once this server's clock (Redis TIME, read here)
-- has reached T. On one Redis server the script reads both keys itself
-- (KEYS[7], KEYS[8]); on a Redis Cluster they live in the tenant's slot,
-- not the topic's, so the gateway passes what it read (ARGV[2], ARGV[10]),
-- which is the same before and after T: every node flips at the same
-- instant of the Redis clock, whatever its cache.
--
-- A claim fixes the message's identity for good:
--   status|seq|shard_month|message_id|event_id|created_at|digest
-- status is 'pending' (allocated; the event may or may not be in the log)
-- or 'done' (acknowledged). Every retry with the same client message id gets
-- the same identity back and produces the same event again: a retry never
-- takes a new seq.
--
-- The seq hash records which incarnation of Redis wrote it (`inc`, the
-- server's run_id; a restarted server or a promoted replica is another
-- process with another run_id). State written by another incarnation may
-- be older than what that one acknowledged (a replica promoted while it
-- lagged, a restart from an AOF or RDB that missed its last second), so it
-- is never allocated from: the topic is fenced until its state has been
-- re-derived from the durable log (src/send/reseed.rs).
--
-- Returns one of:
--   {'OK', seq, shard_month, group_id}
--   {'DUP', claim, group_id}   an earlier claim of this client message id
--   {'RESEED'}        the sender may send, but the seq state is missing:
--                     new topic or Redis lost data
--   {'FENCED'}        the sender may send, but the seq state was written by
--                     another incarnation of Redis
--   {'NOGROUP'}       no group model: rebuild it, then retry
--   {'NOMEMBERS'}     no member set: rebuild the model, then retry
--   {'GFENCED'}       the group model was written by another incarnation
--                     of Redis: rebuild it, then retry
--   {'NOMONTH'}       the tenant's active month is missing (KEYS[7]):
--                     put it back from the catalog, then retry
--   {'NOTMEMBER'} | {'DISSOLVED'} | {'MUTED', until_ms} | {'MUTED_ALL'}

local uid = ARGV[1]

local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local run_id = at and string.sub(info, at + 7, at + 46) or ''

local meta = redis.call('HMGET', KEYS[2], 'group_id', 'status', 'mute_all', 'inc')
if not meta[2] then
  return {'NOGROUP'}
end
if run_id == '' or meta[4] ~= run_id then
  return {'GFENCED'}
end
if meta[2] == 'dissolved' then
  return {'DISSOLVED'}
end
if meta[2] ~= 'active' then
  return {'NOTMEMBER'}
end

if redis.call('SISMEMBER', KEYS[3], uid) == 0 then
  if redis.call('EXISTS', KEYS[3]) == 0 then
    return {'NOMEMBERS'}
  end
  return {'NOTMEMBER'}
end

local role = redis.call('HGET', KEYS[4], uid)
local privileged = role == 'owner' or role == 'admin'
local muted_until = redis.call('HGET', KEYS[5], uid)
if muted_until and tonumber(muted_until) > tonumber(ARGV[3]) and not privileged then
  return {'MUTED', muted_until}
end
if meta[3] == '1' and not privileged then
  return {'MUTED_ALL'}
end

local cmid = ARGV[5]
if cmid ~= '' then
  local prev = redis.call('GET', KEYS[6])
  if prev then
    return {'DUP', prev, meta[1]}
  end
end

local state = redis.call('HMGET', KEYS[1], 'last_seq', 'inc')
if not state[1] then
  return {'RESEED'}
end
if state[2] ~= run_id then
  return {'FENCED'}
end

local month, switch = ARGV[2], ARGV[10] or ''
if KEYS[7] then
  month = redis.call('GET', KEYS[7])
  if not month then
    return {'NOMONTH'}
  end
  switch = redis.call('GET', KEYS[8]) or ''
end
if switch ~= '' then
  local sep = string.find(switch, '@', 1, true)
  local at = sep and tonumber(string.sub(switch, sep + 1))
  if at then
    local next_month = string.sub(switch, 1, sep - 1)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if now >= at and next_month > month then
      month = next_month
    end
  end
end

local seq = redis.call('HINCRBY', KEYS[1], 'last_seq', 1)
local floor = redis.call('HGET', KEYS[1], 'month_floor')
if floor and floor > month then
  month = floor
elseif not floor or floor < month then
  redis.call('HSET', KEYS[1], 'month_floor', month)
end

if cmid ~= '' then
  redis.call('SET', KEYS[6],
    'pending|' .. seq .. '|' .. month .. '|' .. ARGV[6] .. '|' .. ARGV[7] .. '|' .. ARGV[8] .. '|' .. ARGV[9],
    'PX', ARGV[4])
end

return {'OK', seq, month, meta[1]}
