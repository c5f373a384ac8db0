-- advance_month.lua: moves a tenant's active month forward, never back, and
-- ends an announced switch to that month (or an earlier one).
-- KEYS[1] active month key; KEYS[2] the announced switch ('YYYYMM@ms'),
-- optional; ARGV[1] candidate YYYYMM. Returns the month in force.
local current = redis.call('GET', KEYS[1])
if not current or current < ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
  current = ARGV[1]
end
if KEYS[2] then
  local switch = redis.call('GET', KEYS[2])
  if switch and string.sub(switch, 1, 6) <= current then
    redis.call('DEL', KEYS[2])
  end
end
return current
