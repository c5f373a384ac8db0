-- release_lock.lua: deletes a lock only if this holder's token still owns it.
-- KEYS[1] lock key; ARGV[1] token. Returns 1 when released.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
