-- group_synced.lua: a command's change is durable (written to MySQL at
-- `version`): the model is no longer unsynced at that version, and the
-- name's "no such group" marker goes (a create that a restore did not see
-- yet). Tells whether the model is still the one the change was applied
-- to (this incarnation, the same epoch); when not, a restore ran after the
-- durable write, or Redis lost the model, and the next use restores it.
--
-- KEYS[1] meta hash   KEYS[2] the name's "no such group" marker
-- ARGV[1] version     ARGV[2] epoch the change was applied in
--
-- Returns 1 when the model is the one the change was applied to, else 0.
local m = redis.call('HMGET', KEYS[1], 'unsynced', 'epoch', 'inc')
if m[1] == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'unsynced', 'unsynced_claim')
end
redis.call('DEL', KEYS[2])
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
if at and m[3] == string.sub(info, at + 7, at + 46) and (m[2] or '0') == ARGV[2] then
  return 1
end
return 0
