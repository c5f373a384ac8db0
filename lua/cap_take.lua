-- cap_take.lua: one per-user cap (issue 30), checked and taken in one
-- step, so concurrent requests never pass it together (a count in a
-- projection lags the requests it should bound).
--
-- KEYS[1] the cap's HASH: `n` (taken), `inc` (the run_id of the Redis that
--         holds it), and for a cap on distinct items one field `i:<item>`
--         per item held (a favorite saved twice counts once).
-- ARGV[1] 'take': ARGV[2] cap, ARGV[3] amount, ARGV[4] item ('' for none),
--                 ARGV[5] TTL ms (refreshed: an idle user's state goes, and
--                 comes back from MySQL when next needed)
--         'give': ARGV[2] item given back (a favorite removed)
--         'seed': ARGV[2] TTL ms, ARGV[3] n, ARGV[4..] items: the state
--                 derived from MySQL, installed unless a live one is there
--
-- Returns for 'take' {'OK', n} | {'HELD', n} | {'FULL', n} | {'MISSING'}
-- | {'FENCED'} (another incarnation of Redis wrote it: seed again);
-- for 'give' and 'seed' 1 or 0.
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local run_id = at and string.sub(info, at + 7, at + 46) or ''
local inc = redis.call('HGET', KEYS[1], 'inc')
local op = ARGV[1]
if op == 'seed' then
  if inc and inc == run_id then
    return 0
  end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'inc', run_id, 'n', ARGV[3])
  for i = 4, #ARGV do
    redis.call('HSET', KEYS[1], 'i:' .. ARGV[i], '1')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if op == 'give' then
  if inc == run_id and redis.call('HDEL', KEYS[1], 'i:' .. ARGV[2]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'n', -1)
    return 1
  end
  return 0
end
if not inc then
  return {'MISSING'}
end
if inc ~= run_id then
  return {'FENCED'}
end
local cap, amount, item = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if item ~= '' and redis.call('HEXISTS', KEYS[1], 'i:' .. item) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'HELD', n}
end
if n + amount > cap then
  return {'FULL', n}
end
n = redis.call('HINCRBY', KEYS[1], 'n', amount)
if item ~= '' then
  redis.call('HSET', KEYS[1], 'i:' .. item, '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'OK', n}
