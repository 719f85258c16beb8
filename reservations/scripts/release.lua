-- Release a held or committed reservation that never executed: all of it returns.
-- KEYS[1] reservation hash fl:{m}:res:<id> (its prefix names the mission's other keys)
-- KEYS[2] the mission's holding index: a resolved reservation leaves it
-- ARGV[1] '1' when the ledger already recorded this release (Redis follows it, also for a
-- reservation the sweeper marked expiring); else an expiring one is refused
local prefix, rid = string.match(KEYS[1], '^(.*)res:(.+)$')
local leases = prefix .. 'leases'
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'state', 'resolved_at',
  'resolved_seq')
if not r[1] then return {'missing'} end
if r[3] == 'released' then return {'dup', tonumber(r[4]), tonumber(r[5] or 0)} end
local open = r[3] == 'held' or r[3] == 'committed' or (r[3] == 'expiring' and ARGV[1] == '1')
if not open then return {'resolved', r[3]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = 'committed'
if r[3] ~= 'committed' then from = 'reserved' end
for id in string.gmatch(r[2], '[^,]+') do
  redis.call('HINCRBY', prefix .. 'grant:' .. id, from, 0 - tonumber(r[1]))
end
redis.call('HINCRBY', prefix .. 'mission', from, 0 - tonumber(r[1]))
local seq = redis.call('HINCRBY', prefix .. 'mission', 'seq', 1)
redis.call('HSET', KEYS[1], 'state', 'released', 'resolved_at', now, 'resolved_seq', seq)
redis.call('ZREM', leases, rid)
redis.call('ZREM', KEYS[2], rid)
return {'ok', now, seq}
