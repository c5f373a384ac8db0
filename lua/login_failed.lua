-- login_failed.lua: counts one failed login and locks out beyond the free
-- failures, doubling the lockout with every further failure (issue 13).
-- KEYS[1] failure counter, KEYS[2] lock (same hash tag).
-- ARGV[1] free failures, ARGV[2] first lockout ms, ARGV[3] longest ms.
-- Returns the lockout now in force, in ms (0: none).
local n = redis.call('INCR', KEYS[1])
local free = tonumber(ARGV[1])
local first = tonumber(ARGV[2])
local longest = tonumber(ARGV[3])
-- The count is forgotten a while after the longest lockout.
redis.call('PEXPIRE', KEYS[1], longest * 2)
if n <= free then
  return 0
end
local lock = first * 2 ^ math.min(n - free - 1, 30)
if lock > longest then
  lock = longest
end
lock = math.floor(lock)
redis.call('SET', KEYS[2], '1', 'PX', lock)
return lock
