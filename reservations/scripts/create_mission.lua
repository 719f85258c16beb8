-- Create a mission budget scope atomically; identical terms again is a no-op.
-- KEYS[1] mission hash   ARGV[1] ceiling (micro-units)
local m = redis.call('HGET', KEYS[1], 'ceiling')
if m then
  if m == ARGV[1] then return {'dup'} end
  return {'conflict', m}
end
redis.call('HSET', KEYS[1], 'ceiling', ARGV[1], 'reserved', 0, 'committed', 0, 'settled', 0)
return {'ok'}
