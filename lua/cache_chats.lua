-- cache_chats.lua: replaces a user's chat-list hot copy with what MySQL held
-- when the fill read it, but only if nothing was projected since: pipelines
-- bump the version (and drop the copy) after every membership change they
-- apply, and bump it when a cursor move finds no copy. So a fill never
-- brings back a conversation left meanwhile, nor an older cursor.
--
-- KEYS[1] the list HASH   KEYS[2] its version (STRING counter)
-- ARGV[1] the version read before MySQL ('' when there was none)
-- ARGV[2] TTL, seconds
-- ARGV[3..] field, value pairs
--
-- Returns 1 when cached, 0 when the version moved (the next read fills).
local version = redis.call('GET', KEYS[2]) or ''
if version ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], '_v', '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
