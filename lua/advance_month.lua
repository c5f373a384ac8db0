-- advance_month.lua: moves a tenant's active month forward, never back.
-- KEYS[1] active month key; ARGV[1] candidate YYYYMM. Returns the month in force.
local current = redis.call('GET', KEYS[1])
if not current or current < ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return current
