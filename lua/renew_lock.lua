-- renew_lock.lua: extends a lock only if this holder's token still owns it.
-- KEYS[1] lock key; ARGV[1] token; ARGV[2] TTL, ms. Returns 1 when renewed.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
