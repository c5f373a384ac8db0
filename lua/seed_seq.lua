-- seed_seq.lua: installs a topic's re-derived seq allocator, stamped with
-- this Redis incarnation (`inc`: the server's run_id, see allocate_seq.lua),
-- only while the state is still what the re-seed found. Another re-seed may
-- have installed it meanwhile, and sends have been allocating from it since:
-- overwriting it would move last_seq back and hand out seqs twice.
--
-- KEYS[1]      seq hash (last_seq, month_floor, inc)
-- KEYS[2..n]   client message id claims to put back (same hash tag)
-- ARGV[1]      last_seq
-- ARGV[2]      month floor YYYYMM ('' for none)
-- ARGV[3]      the state found: '' missing, or the `inc` it had ('-' none)
-- ARGV[4]      claim TTL, ms
-- ARGV[5..]    one claim value per claim key; a claim that exists is kept
--
-- Returns 1 when installed, 0 when the state changed meanwhile (kept).
local found = redis.call('HMGET', KEYS[1], 'last_seq', 'inc')
if ARGV[3] == '' then
  if found[1] then
    return 0
  end
elseif not found[1] or (found[2] or '-') ~= ARGV[3] then
  return 0
end
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not at then
  return redis.error_reply('no run_id in INFO server')
end
local last = tonumber(ARGV[1])
if found[1] and tonumber(found[1]) > last then
  -- Never back: a stale allocator is still a floor.
  last = tonumber(found[1])
end
redis.call('HSET', KEYS[1], 'last_seq', last, 'inc', string.sub(info, at + 7, at + 46))
if ARGV[2] ~= '' then
  local floor = redis.call('HGET', KEYS[1], 'month_floor')
  if not floor or floor < ARGV[2] then
    redis.call('HSET', KEYS[1], 'month_floor', ARGV[2])
  end
end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 3], 'NX', 'PX', ARGV[4])
end
return 1
