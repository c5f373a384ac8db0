-- seq_extend.lua: a block reserved in the topic's durable mark becomes
-- usable (src/send/marks.rs): `end` rises to the mark, the month floor to
-- the reservation's month, only while the allocator is the one the
-- reservation was asked for (the same incarnation of Redis). An allocator
-- restored meanwhile is left alone: its own restore reserved past this.
--
-- KEYS[1]  seq hash
-- ARGV[1]  the incarnation (run_id) the reservation was asked by
-- ARGV[2]  the new end (the mark)
-- ARGV[3]  month floor YYYYMM
-- ARGV[4]  block size
-- ARGV[5]  now, epoch ms
--
-- Returns 1 when extended (or already past it), 0 when the allocator is
-- another incarnation's or missing.
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local run_id = at and string.sub(info, at + 7, at + 46) or ''
local s = redis.call('HMGET', KEYS[1], 'last_seq', 'inc', 'end', 'month_floor')
if not s[1] or s[2] ~= ARGV[1] or s[2] ~= run_id then
  return 0
end
if not s[3] or tonumber(s[3]) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'end', ARGV[2], 'blk', ARGV[4], 'at', ARGV[5])
end
if not s[4] or s[4] < ARGV[3] then
  redis.call('HSET', KEYS[1], 'month_floor', ARGV[3])
end
redis.call('HDEL', KEYS[1], 'pf')
return 1
