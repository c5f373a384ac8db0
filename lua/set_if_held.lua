-- set_if_held.lua: sets a key only while a lock is held by this holder's
-- token (a write that must not outlive the lock: a restore pass's marker,
-- which a FLUSHALL or a restart during the pass must not leave claiming
-- what the pass did before it).
-- KEYS[1] lock key; KEYS[2] key to set (the same slot); ARGV[1] token;
-- ARGV[2] value. Returns 1 when set, 0 when the lock is not held.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
