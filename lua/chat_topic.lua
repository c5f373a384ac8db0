-- chat_topic.lua: writes a topic's chat-list state (`seq|touched|from|…`,
-- read back from MySQL after a commit) unless the stored one is of a later
-- seq, so a late writer never moves a list back.
--
-- KEYS[1] the state STRING
-- ARGV[1] seq   ARGV[2] the state   ARGV[3] TTL, seconds
--
-- Returns 1 when written, 0 when a later state is kept.
local old = redis.call('GET', KEYS[1])
if old then
  local seq = tonumber(string.match(old, '^(%-?%d+)|'))
  if seq and seq > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
