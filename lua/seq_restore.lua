-- seq_restore.lua: installs a topic's seq allocator restored from its
-- durable mark (src/send/marks.rs), stamped with this Redis incarnation,
-- unless a live one is there already (another restore installed it, and
-- sends may have allocated from it since: it is kept). Whatever state is
-- there otherwise is older than the mark, which covers every seq any
-- incarnation handed out.
--
-- KEYS[1]  seq hash
-- ARGV[1]  last_seq (the mark before the block reserved for this restore)
-- ARGV[2]  end (the top of that block)
-- ARGV[3]  month floor YYYYMM ('' for none)
-- ARGV[4]  restored at, epoch ms ('' for a topic with no history: its
--          client message ids cannot have lost their claims)
-- ARGV[5]  block size
-- ARGV[6]  now, epoch ms
-- ARGV[7]  '1' when the whole tenant was forgotten (its restore marker did
--          not name this incarnation when the restore began): any restore
--          pass of this incarnation covers its claims; '' when only this
--          topic's keys were lost: a pass begun after `rec` must
--
-- Returns 1 when installed, 0 when a live allocator was kept.
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if not at then
  return redis.error_reply('no run_id in INFO server')
end
local run_id = string.sub(info, at + 7, at + 46)
local found = redis.call('HMGET', KEYS[1], 'last_seq', 'inc', 'month_floor')
if found[1] and found[2] == run_id then
  return 0
end
local floor = ARGV[3]
if found[3] and found[3] > floor then
  floor = found[3]
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'last_seq', ARGV[1], 'end', ARGV[2], 'inc', run_id,
  'blk', ARGV[5], 'at', ARGV[6])
if floor ~= '' then
  redis.call('HSET', KEYS[1], 'month_floor', floor)
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'rec', ARGV[4])
  if ARGV[7] == '1' then
    redis.call('HSET', KEYS[1], 'rw', '1')
  end
end
return 1
