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
-- KEYS[1] seq hash     (last_seq, inc, end, month_floor, rec, rw, blk, at, pf)
-- KEYS[2] meta hash    (group_id, status, mute_all, inc)
-- KEYS[3] members set  KEYS[4] roles hash (uid -> owner|admin)
-- KEYS[5] mutes hash (uid -> muted-until epoch ms)
-- KEYS[6] invites hash KEYS[7] left hash: with KEYS[3..5], the parts of
--         the group's model, each holding a placeholder so that all five
--         exist while the model does (a part missing alone is a partial
--         loss: the model is restored, never decided on)
-- KEYS[8] uniq claim   (only read/written when ARGV[5] ~= '')
-- KEYS[9] the tenant's active month      (one Redis server only, see below)
-- KEYS[10] the tenant's announced switch (one Redis server only)
-- ARGV[1] uid
-- ARGV[2] active month YYYYMM as the gateway read it ('' with KEYS[9])
-- ARGV[3] now, epoch ms
-- ARGV[4] pending claim TTL, ms
-- ARGV[5] client message id ('' for none)
-- ARGV[6] message id (Snowflake) to record in the claim
-- ARGV[7] event id to record in the claim
-- ARGV[8] created_at, epoch ms, to record in the claim
-- ARGV[9] digest of the message (content, head, edit target)
-- ARGV[10] announced switch 'YYYYMM@epoch_ms' as the gateway read it
--          ('' for none, or with KEYS[10])
-- ARGV[11] '1' when the gateway already looked the client message id up
--          in the durable claims (see CLAIMCHECK)
--
-- The month (seed 000 §2.1: the script decides it, one month for every
-- node at once). The shard manager switches a tenant's month in two
-- steps: it announces 'next@T' (T = Redis TIME + 2 s, more than the 1 s a
-- gateway caches what it read), waits until T, then sets the active month
-- and removes the announcement. The month of a message is the active month,
-- or the announced one once this server's clock (Redis TIME, read here)
-- has reached T. On one Redis server the script reads both keys itself
-- (KEYS[9], KEYS[10]); on a Redis Cluster they live in the tenant's slot,
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
-- be older than what that one handed out (a replica promoted while it
-- lagged, a restart from an AOF or RDB that missed its last second), so it
-- is never allocated from: the topic is fenced until it is restored from
-- its durable seq mark (src/send/marks.rs).
--
-- Seqs are handed out only below `end`, the top of a block reserved in
-- the durable mark first (MySQL `im_seq_marks`): every seq ever handed out
-- is <= the mark, so a restore continues from it. A block used up, or a
-- message of a month newer than the topic's floor (months never go back,
-- and the mark records the floor), asks for the next block (NEEDBLOCK).
-- When a block runs low the reply says so (once per 5 s) and the gateway
-- reserves the next one in the background.
--
-- `rec` is set on a topic restored after Redis forgot: client message id
-- claims of messages acknowledged before may be gone too, so for the
-- claim's lifetime a client message id without a claim is first looked up
-- in the durable claims (CLAIMCHECK) before it may take a new seq.
--
-- Returns one of:
--   {'OK', seq, shard_month, group_id, low}  low '1': reserve the next block
--   {'DUP', claim, group_id}   an earlier claim of this client message id
--   {'RESEED'}        the sender may send, but the seq state is missing:
--                     new topic or Redis lost data
--   {'FENCED'}        the sender may send, but the seq state was written by
--                     another incarnation of Redis
--   {'NEEDBLOCK', last_seq, end, month, blk, at, run_id}
--                     reserve the next block (at least past last_seq and
--                     end, with the month), then retry
--   {'CLAIMCHECK', run_id, rec, rw}
--                     look the client message id up, then retry with ARGV[11]
--                     (rw '1': the whole tenant was forgotten, any restore
--                     pass of run_id covers the claims; else one begun
--                     after rec)
--   {'NOGROUP'}       no group model: restore it, then retry
--   {'NOMEMBERS'}     a part of the group model is missing: restore it
--   {'GFENCED'}       the group model was written by another incarnation
--                     of Redis: restore it, then retry
--   {'NOMONTH'}       the tenant's active month is missing (KEYS[9]):
--                     put it back from the catalog, then retry
--   {'NOTMEMBER'} | {'DISSOLVED'} | {'MUTED', until_ms} | {'MUTED_ALL'}

local uid = ARGV[1]
local now = tonumber(ARGV[3])

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
if redis.call('EXISTS', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]) ~= 5 then
  return {'NOMEMBERS'}
end
if redis.call('SISMEMBER', KEYS[3], uid) == 0 then
  return {'NOTMEMBER'}
end

local role = redis.call('HGET', KEYS[4], uid)
local privileged = role == 'owner' or role == 'admin'
local muted_until = redis.call('HGET', KEYS[5], uid)
if muted_until and tonumber(muted_until) > now and not privileged then
  return {'MUTED', muted_until}
end
if meta[3] == '1' and not privileged then
  return {'MUTED_ALL'}
end

local cmid = ARGV[5]
if cmid ~= '' then
  local prev = redis.call('GET', KEYS[8])
  if prev then
    return {'DUP', prev, meta[1]}
  end
end

local state = redis.call('HMGET', KEYS[1], 'last_seq', 'inc', 'end', 'month_floor', 'rec', 'blk', 'at', 'pf', 'rw')
if not state[1] then
  return {'RESEED'}
end
if state[2] ~= run_id then
  return {'FENCED'}
end
if cmid ~= '' and state[5] and ARGV[11] ~= '1' and now - tonumber(state[5]) < tonumber(ARGV[4]) then
  return {'CLAIMCHECK', run_id, state[5], state[9] or ''}
end

local month, switch = ARGV[2], ARGV[10] or ''
if KEYS[9] then
  month = redis.call('GET', KEYS[9])
  if not month then
    return {'NOMONTH'}
  end
  switch = redis.call('GET', KEYS[10]) or ''
end
if switch ~= '' then
  local sep = string.find(switch, '@', 1, true)
  local instant = sep and tonumber(string.sub(switch, sep + 1))
  if instant then
    local next_month = string.sub(switch, 1, sep - 1)
    local t = redis.call('TIME')
    local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if clock >= instant and next_month > month then
      month = next_month
    end
  end
end
local floor = state[4]
if floor and floor > month then
  month = floor
end

local last = tonumber(state[1])
local top = tonumber(state[3])
if not top or last >= top or not floor or month > floor then
  return {'NEEDBLOCK', state[1], state[3] or '', month, state[6] or '', state[7] or '', run_id}
end

local seq = redis.call('HINCRBY', KEYS[1], 'last_seq', 1)
local low = ''
local blk = tonumber(state[6]) or 8
if top - seq <= math.floor(blk / 2) and (not state[8] or now - tonumber(state[8]) > 5000) then
  redis.call('HSET', KEYS[1], 'pf', now)
  low = '1'
end

if cmid ~= '' then
  redis.call('SET', KEYS[8],
    'pending|' .. seq .. '|' .. month .. '|' .. ARGV[6] .. '|' .. ARGV[7] .. '|' .. ARGV[8] .. '|' .. ARGV[9],
    'PX', ARGV[4])
end

return {'OK', seq, month, meta[1], low}
