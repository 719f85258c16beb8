-- Lift the block an untreated overrun put on a scope (the ledger checks who may treat it).
-- KEYS[1] scope hash (mission or grant)
local h = redis.call('HMGET', KEYS[1], 'ceiling', 'blocked')
if not h[1] then return {'missing'} end
if not h[2] then return {'not_blocked'} end
redis.call('HDEL', KEYS[1], 'blocked')
return {'ok', h[2]}
