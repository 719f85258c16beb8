-- Settle a held or committed reservation with its actual cost; the unused part returns.
-- Above the reserved amount it is an overrun: recorded honestly and the leaf scope is blocked.
-- KEYS[1] reservation hash fl:{m}:res:<id> (its prefix names the mission's other keys)
-- KEYS[2] the mission's holding index: a resolved reservation leaves it
-- ARGV[1] actual   ARGV[2] '1' when the ledger already recorded this settle (Redis follows it,
-- also for a reservation the sweeper marked expiring); else an expiring one is refused
local prefix, rid = string.match(KEYS[1], '^(.*)res:(.+)$')
local leases = prefix .. 'leases'
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'state', 'actual', 'resolved_at',
  'resolved_seq')
if not r[1] then return {'missing'} end
if r[3] == 'settled' or r[3] == 'overrun' then
  if r[4] == ARGV[1] then return {'dup', r[3], tonumber(r[5]), tonumber(r[6] or 0)} end
  return {'resolved', r[3], r[4]}
end
local open = r[3] == 'held' or r[3] == 'committed' or (r[3] == 'expiring' and ARGV[2] == '1')
if not open then return {'resolved', r[3], ''} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = 'committed'
if r[3] ~= 'committed' then from = 'reserved' end
local keys = {}
for id in string.gmatch(r[2], '[^,]+') do keys[#keys + 1] = prefix .. 'grant:' .. id end
keys[#keys + 1] = prefix .. 'mission'
for _, key in ipairs(keys) do
  redis.call('HINCRBY', key, from, 0 - tonumber(r[1]))
  redis.call('HINCRBY', key, 'settled', ARGV[1])
end
local state = 'settled'
if tonumber(ARGV[1]) > tonumber(r[1]) then
  state = 'overrun'
  redis.call('HSET', keys[1], 'blocked', rid)
end
local seq = redis.call('HINCRBY', prefix .. 'mission', 'seq', 1)
redis.call('HSET', KEYS[1], 'state', state, 'actual', ARGV[1], 'resolved_at', now,
  'resolved_seq', seq)
redis.call('ZREM', leases, rid)
redis.call('ZREM', KEYS[2], rid)
return {'ok', state, now, seq}
