-- Create a grant budget scope atomically; it must fit in its parent's remaining budget.
-- KEYS[1] grant hash   KEYS[2] parent hash (mission or grant)
-- ARGV[1] budget   ARGV[2] parent scope name ('mission' or a grant id)
local g = redis.call('HMGET', KEYS[1], 'ceiling', 'parent')
if g[1] then
  if g[1] == ARGV[1] and g[2] == ARGV[2] then return {'dup'} end
  return {'conflict', g[1], g[2] or ''}
end
local p = redis.call('HMGET', KEYS[2], 'ceiling', 'reserved', 'committed', 'settled')
if not p[1] then return {'missing', ARGV[2]} end
local ceiling = tonumber(p[1])
local remaining = ceiling - (tonumber(p[2]) + tonumber(p[3]) + tonumber(p[4]))
if tonumber(ARGV[1]) > remaining then return {'deny', ARGV[2], remaining, ceiling} end
redis.call('HSET', KEYS[1], 'ceiling', ARGV[1], 'reserved', 0, 'committed', 0, 'settled', 0,
  'parent', ARGV[2])
return {'ok'}
