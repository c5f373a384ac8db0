-- seq_state.lua: a topic's seq state as a restore needs it, and which
-- incarnation of Redis answers (its run_id; see allocate_seq.lua). Run on
-- the node that holds the topic's keys.
--
-- KEYS[1] seq hash (last_seq, month_floor, inc, end, rec)
--
-- Returns {last_seq, month_floor, inc, run_id, end, rec}, '' for what is
-- missing.
local s = redis.call('HMGET', KEYS[1], 'last_seq', 'month_floor', 'inc', 'end', 'rec')
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
return {s[1] or '', s[2] or '', s[3] or '', at and string.sub(info, at + 7, at + 46) or '', s[4] or '', s[5] or ''}
