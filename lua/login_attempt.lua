-- login_attempt.lua: reserves one login attempt of a subject (a login name
-- or a client address) before its credentials are checked, so concurrent
-- attempts are counted one by one (issue 28): at most `free` are checked
-- before a lockout, however many arrive at once. The count holds failures
-- and attempts still being checked; a success gives its attempt back
-- (or, for a login name, clears the count). The attempt that takes the
-- last free one locks the subject at once, so the ones racing it are
-- refused; once a lockout ends one more attempt is let through and locks
-- it again, twice as long (up to the longest).
-- KEYS[1] attempt counter, KEYS[2] lock (same hash tag).
-- ARGV[1] free attempts, ARGV[2] first lockout ms, ARGV[3] longest ms.
-- Returns 0 when the attempt may be checked, else the lockout in force (ms).
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
  return ttl
end
local free = math.max(tonumber(ARGV[1]), 1)
local first = tonumber(ARGV[2])
local longest = tonumber(ARGV[3])
local n = redis.call('INCR', KEYS[1])
-- The count is forgotten a while after the longest lockout.
redis.call('PEXPIRE', KEYS[1], longest * 2)
if n >= free then
  local lock = first * 2 ^ math.min(n - free, 30)
  if lock > longest then
    lock = longest
  end
  redis.call('SET', KEYS[2], '1', 'PX', math.floor(lock))
end
return 0
