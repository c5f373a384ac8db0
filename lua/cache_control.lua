-- Caches one user's session-control state (src/session_control.rs), read
-- from MySQL at row `version`, unless the cache already holds that
-- version or a newer one: a slow rebuild never overwrites what the control
-- pipeline wrote after it read. The state is one hash, so it is evicted or
-- lost whole: a cached version always comes with every revocation.
-- KEYS[1] the user's control hash.
-- ARGV[1] version, ARGV[2] auth_version, ARGV[3] disabled (1/0),
-- ARGV[4] expiry (s) of the hash (0: none), ARGV[5..] device, generation
-- pairs.
local cur = tonumber(redis.call('HGET', KEYS[1], 'v') or '-1')
if tonumber(ARGV[1]) <= cur then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[1])
if tonumber(ARGV[4]) > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
else
  redis.call('PERSIST', KEYS[1])
end
local function set_max(field, value)
  local have = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if tonumber(value) > have then
    redis.call('HSET', KEYS[1], field, value)
  end
end
set_max('av', ARGV[2])
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'disabled', '1')
else
  redis.call('HDEL', KEYS[1], 'disabled')
end
for i = 5, #ARGV, 2 do
  set_max('d:' .. ARGV[i], ARGV[i + 1])
end
return 1
