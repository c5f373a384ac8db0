-- claim_done.lua: a message's event is in the log: its client message id
-- claim becomes `done`, unless the claim is another message's. After a
-- Redis loss the claim may be gone (it is put back, done) or, in a race
-- across the loss, held by a retry that took another seq (kept: counted).
--
-- KEYS[1] the claim
-- ARGV[1] the done claim text
-- ARGV[2] the message's event id (the claim's fifth field)
-- ARGV[3] TTL, ms
--
-- Returns 1 when written, 0 when the claim holds another message.
local function split(text)
  local out, from = {}, 1
  while true do
    local at = string.find(text, '|', from, true)
    if not at then
      out[#out + 1] = string.sub(text, from)
      return out
    end
    out[#out + 1] = string.sub(text, from, at - 1)
    from = at + 1
  end
end
local cur = redis.call('GET', KEYS[1])
if cur then
  local fields, ours = split(cur), split(ARGV[1])
  -- Old four-field claims (`done|seq|month|id`) name no event: the seq does.
  if fields[5] ~= ARGV[2] and fields[2] ~= ours[2] then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
