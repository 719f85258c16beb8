-- Release a held or committed reservation that never executed: all of it returns.
-- KEYS as commit.lua's (the holding index: a resolved reservation leaves it)
-- ARGV[1] reservation id   ARGV[2] declared grant chain ('' for none)   ARGV[3] '1' when the
-- ledger already recorded this release (Redis follows it, also for a reservation the sweeper
-- marked expiring); else an expiring one is refused
-- A stored chain other than the declared one writes nothing: {'chain', stored chain}.
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'state', 'resolved_at',
  'resolved_seq')
if not r[1] then return {'missing'} end
if r[3] == 'released' then return {'dup', tonumber(r[4]), tonumber(r[5] or 0)} end
local open = r[3] == 'held' or r[3] == 'committed' or (r[3] == 'expiring' and ARGV[3] == '1')
if not open then return {'resolved', r[3]} end
if r[2] ~= ARGV[2] then return {'chain', r[2]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = 'committed'
if r[3] ~= 'committed' then from = 'reserved' end
for i = 6, #KEYS do redis.call('HINCRBY', KEYS[i], from, 0 - tonumber(r[1])) end
redis.call('HINCRBY', KEYS[3], from, 0 - tonumber(r[1]))
local seq = redis.call('HINCRBY', KEYS[3], 'seq', 1)
redis.call('HSET', KEYS[1], 'state', 'released', 'resolved_at', now, 'resolved_seq', seq)
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok', now, seq}
