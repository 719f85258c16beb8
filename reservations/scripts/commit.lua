-- Commit a held reservation (work started): the lease no longer expires it.
-- KEYS as reserve.lua's: [1] reservation hash [2] holding index [3] mission hash [4] leases
-- [5] branches [6..] the grant hashes of the chain the caller declares (ARGV[2], leaf first)
-- ARGV[1] reservation id   ARGV[2] declared grant chain, comma joined ('' for none)
-- A stored chain other than the declared one writes nothing: {'chain', stored chain}, and the
-- client calls again with those keys.
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'lease_until', 'state',
  'committed_at', 'committed_seq')
if not r[1] then return {'missing'} end
if r[4] == 'committed' then return {'dup', tonumber(r[5]), tonumber(r[6] or 0)} end
-- marked by the sweeper: its expiry is being recorded, as for an ended lease
if r[4] == 'expiring' then return {'lease_ended', tonumber(r[3])} end
if r[4] ~= 'held' then return {'resolved', r[4]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(r[3]) then return {'lease_ended', tonumber(r[3])} end
if r[2] ~= ARGV[2] then return {'chain', r[2]} end
local keys = {KEYS[3]}
for i = 6, #KEYS do keys[#keys + 1] = KEYS[i] end
for _, key in ipairs(keys) do
  redis.call('HINCRBY', key, 'reserved', 0 - tonumber(r[1]))
  redis.call('HINCRBY', key, 'committed', r[1])
end
local seq = redis.call('HINCRBY', KEYS[3], 'seq', 1)
redis.call('HSET', KEYS[1], 'state', 'committed', 'committed_at', now, 'committed_seq', seq)
redis.call('ZREM', KEYS[4], ARGV[1])
return {'ok', now, seq}
