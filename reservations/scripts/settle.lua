-- Settle a held or committed reservation with its actual cost; the unused part returns.
-- Above the reserved amount it is an overrun: recorded honestly and the leaf scope is blocked.
-- KEYS as commit.lua's (the holding index: a resolved reservation leaves it)
-- ARGV[1] reservation id   ARGV[2] declared grant chain ('' for none)   ARGV[3] actual
-- ARGV[4] '1' when the ledger already recorded this settle (Redis follows it, also for a
-- reservation the sweeper marked expiring); else an expiring one is refused
-- A stored chain other than the declared one writes nothing: {'chain', stored chain}.
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'state', 'actual', 'resolved_at',
  'resolved_seq')
if not r[1] then return {'missing'} end
if r[3] == 'settled' or r[3] == 'overrun' then
  if r[4] == ARGV[3] then return {'dup', r[3], tonumber(r[5]), tonumber(r[6] or 0)} end
  return {'resolved', r[3], r[4]}
end
local open = r[3] == 'held' or r[3] == 'committed' or (r[3] == 'expiring' and ARGV[4] == '1')
if not open then return {'resolved', r[3], ''} end
if r[2] ~= ARGV[2] then return {'chain', r[2]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = 'committed'
if r[3] ~= 'committed' then from = 'reserved' end
local keys = {}
for i = 6, #KEYS do keys[#keys + 1] = KEYS[i] end
keys[#keys + 1] = KEYS[3]
for _, key in ipairs(keys) do
  redis.call('HINCRBY', key, from, 0 - tonumber(r[1]))
  redis.call('HINCRBY', key, 'settled', ARGV[3])
end
local state = 'settled'
if tonumber(ARGV[3]) > tonumber(r[1]) then
  state = 'overrun'
  redis.call('HSET', keys[1], 'blocked', ARGV[1])
end
local seq = redis.call('HINCRBY', KEYS[3], 'seq', 1)
redis.call('HSET', KEYS[1], 'state', state, 'actual', ARGV[3], 'resolved_at', now,
  'resolved_seq', seq)
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok', state, now, seq}
