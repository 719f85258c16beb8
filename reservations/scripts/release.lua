-- Release a held or committed reservation that never executed: all of it returns.
-- KEYS[1] reservation hash   KEYS[2] leases zset   ARGV[1] reservation id   ARGV[2] key prefix
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'state', 'resolved_at',
  'resolved_seq')
if not r[1] then return {'missing'} end
if r[3] == 'released' then return {'dup', tonumber(r[4]), tonumber(r[5] or 0)} end
if r[3] ~= 'held' and r[3] ~= 'committed' then return {'resolved', r[3]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = 'committed'
if r[3] == 'held' then from = 'reserved' end
for id in string.gmatch(r[2], '[^,]+') do
  redis.call('HINCRBY', ARGV[2] .. 'grant:' .. id, from, 0 - tonumber(r[1]))
end
redis.call('HINCRBY', ARGV[2] .. 'mission', from, 0 - tonumber(r[1]))
local seq = redis.call('HINCRBY', ARGV[2] .. 'mission', 'seq', 1)
redis.call('HSET', KEYS[1], 'state', 'released', 'resolved_at', now, 'resolved_seq', seq)
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok', now, seq}
