-- Commit a held reservation (work started): the lease no longer expires it.
-- KEYS[1] reservation hash fl:{m}:res:<id> (its prefix names the mission's other keys)
local prefix, rid = string.match(KEYS[1], '^(.*)res:(.+)$')
local leases = prefix .. 'leases'
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
local keys = {}
for id in string.gmatch(r[2], '[^,]+') do keys[#keys + 1] = prefix .. 'grant:' .. id end
keys[#keys + 1] = prefix .. 'mission'
for _, key in ipairs(keys) do
  redis.call('HINCRBY', key, 'reserved', 0 - tonumber(r[1]))
  redis.call('HINCRBY', key, 'committed', r[1])
end
local seq = redis.call('HINCRBY', prefix .. 'mission', 'seq', 1)
redis.call('HSET', KEYS[1], 'state', 'committed', 'committed_at', now, 'committed_seq', seq)
redis.call('ZREM', leases, rid)
return {'ok', now, seq}
