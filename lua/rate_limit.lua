-- rate_limit.lua: one token bucket of one user (issue 13, seed 001 §5.1).
-- KEYS[1] the bucket, HASH tokens, at (ms), under the user's hash tag.
-- ARGV[1] burst, ARGV[2] refill per minute, ARGV[3] cost.
-- Returns 0 when the cost was taken, else the ms until it could be.
-- The clock is Redis TIME, so every gateway refills the same way.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 60000
local cost = tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(b[1]) or burst
local at = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = math.ceil((cost - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
-- Gone once it would be full again: an idle user costs no memory.
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 1000)
return wait
