-- seed_seq.lua: installs a re-seeded topic seq allocator, only while it is
-- still missing. Another re-seed may have installed it meanwhile, and sends
-- have been allocating from it since: overwriting it would move last_seq
-- back and hand out seqs twice.
--
-- KEYS[1] seq hash (last_seq, month_floor)
-- ARGV[1] last_seq
-- ARGV[2] month floor YYYYMM ('' for none)
--
-- Returns 1 when installed, 0 when the allocator already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'last_seq', ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'month_floor', ARGV[2])
end
return 1
