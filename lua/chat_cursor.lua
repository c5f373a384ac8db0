-- chat_cursor.lua: moves a user's cursors of one conversation forward in the
-- chat-list hot copy (each of read, recv and clear only grows, as in MySQL).
-- Without a copy nothing is written, but the version moves, so a fill that
-- read MySQL before this cursor was committed is not cached.
--
-- KEYS[1] the list HASH   KEYS[2] its version (STRING counter)
-- ARGV[1] topic   ARGV[2] read   ARGV[3] recv   ARGV[4] clear (0: unchanged)
-- ARGV[5] the version's TTL, seconds
--
-- Returns 1 when the copy was updated, 0 when there was none.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  return 0
end
local field = 'c:' .. ARGV[1]
local read, recv, clear = 0, 0, 0
local old = redis.call('HGET', KEYS[1], field)
if old then
  local a, b, c = string.match(old, '^(%d+)|(%d+)|(%d+)$')
  read, recv, clear = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
end
read = math.max(read, tonumber(ARGV[2]))
recv = math.max(recv, tonumber(ARGV[3]))
clear = math.max(clear, tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], field, string.format('%d|%d|%d', read, recv, clear))
return 1
