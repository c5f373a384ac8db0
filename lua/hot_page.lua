-- A newest-first history page in one round trip (issue 31): the topic's
-- route (`route_meta`), its dellog token and the hot messages of the page,
-- read together. Every key carries the topic's hash tag {tenant:topic}, so
-- on a Redis Cluster the script and the snapshot keys it builds live in
-- one slot.
--
-- KEYS[1] route_meta (HASH month -> "min_seq=..,max_seq=..,count=..")
-- KEYS[2] hot_msg_seqs (ZSET "seq:..." scored by seq)
-- KEYS[3] dellog token (STRING)
-- ARGV[1] max score ("+inf" or "(before"), ARGV[2] min score,
-- ARGV[3] limit, ARGV[4] the prefix of a snapshot key ("...:hot_msg:")
--
-- Returns {route_meta, token or nil, members, snapshots}; the caller
-- decides whether the hot set covers the page (see src/history/hot.rs).

local meta = redis.call('HGETALL', KEYS[1])
local token = redis.call('GET', KEYS[3])
local members = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[2], 'LIMIT', 0, ARGV[3])
local snapshots = {}
if #members > 0 then
  local names = {}
  for i, m in ipairs(members) do
    local seq = string.match(m, '^(%-?%d+):')
    if not seq then
      -- Not a snapshot member: the caller falls back to the stored page.
      return {meta, token, {}, {}}
    end
    names[i] = ARGV[4] .. seq
  end
  snapshots = redis.call('MGET', unpack(names))
end
return {meta, token, members, snapshots}
