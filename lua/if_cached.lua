-- if_cached.lua: applies one write to a cache key only if the key is cached,
-- so a partial write never makes a missing cache look complete.
-- KEYS[1] key; ARGV[1] command (SADD, SREM, HSET, HDEL); ARGV[2..] its arguments.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))
end
return false
