-- Caches one user's session-control state (src/session_control.rs), read
-- from MySQL at row `version`, unless the cache already holds that
-- version or a newer one: a slow rebuild never overwrites what the control
-- pipeline wrote after it read.
-- KEYS[1] version, KEYS[2] auth_version, KEYS[3] disabled,
-- KEYS[4..] device generations.
-- ARGV[1] version, ARGV[2] auth_version, ARGV[3] disabled (1/0),
-- ARGV[4] expiry (s) of the version key (0: none), ARGV[5..] generations.
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) <= cur then
  return 0
end
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
local function set_max(key, value)
  local have = tonumber(redis.call('GET', key) or '0')
  if tonumber(value) > have then
    redis.call('SET', key, value)
  end
end
set_max(KEYS[2], ARGV[2])
if ARGV[3] == '1' then
  redis.call('SET', KEYS[3], '1')
else
  redis.call('DEL', KEYS[3])
end
for i = 4, #KEYS do
  set_max(KEYS[i], ARGV[i + 1])
end
return 1
