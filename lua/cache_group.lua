-- cache_group.lua: replaces a group's Redis cache with what MySQL held when
-- the load read it, but only if no membership change was projected since
-- (the members pipeline bumps the version before each change it applies),
-- so a load can never bring back a member removed meanwhile.
--
-- KEYS[1] members set   KEYS[2] roles hash   KEYS[3] mutes hash
-- KEYS[4] meta hash     KEYS[5] version (STRING counter)
-- ARGV[1] the version read before MySQL ('' when there was none)
-- ARGV[2] TTL, seconds
-- ARGV[3] group_id   ARGV[4] status   ARGV[5] mute_all ('1' | '0')
-- ARGV[6] placeholder member (keeps an empty set distinguishable from "not cached")
-- ARGV[7..] one triplet per member: uid, role ('' for a plain member), muted-until ('' for none)
--
-- Returns 1 when cached, 0 when the version moved (load again).
local version = redis.call('GET', KEYS[5]) or ''
if version ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('SADD', KEYS[1], ARGV[6])
for i = 7, #ARGV, 3 do
  redis.call('SADD', KEYS[1], ARGV[i])
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
  if ARGV[i + 2] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 2])
  end
end
redis.call('HSET', KEYS[4], 'group_id', ARGV[3], 'status', ARGV[4], 'mute_all', ARGV[5])
for k = 1, 4 do
  redis.call('EXPIRE', KEYS[k], ARGV[2])
end
return 1
