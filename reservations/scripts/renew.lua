-- A Branch's heartbeat: move its lease to now + ARGV[1] ms while it runs. A held reservation's
-- lease is what the sweeper expires; a committed one's is its liveness: once it passes, the
-- coordinator settles the reservation in full (its worker died after its effect started).
-- A lease that has passed is never renewed, so what the sweeper or the coordinator decides
-- from it stands.
-- KEYS[1] reservation hash   KEYS[2] leases zset
-- ARGV[1] lease (ms)   ARGV[2] reservation id
-- Returns {'ok', lease_until} | {'lease_ended', lease_until} | {'resolved', state} | {'missing'}
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_until')
if not r[1] then return {'missing'} end
if r[1] == 'expiring' then return {'lease_ended', tonumber(r[2])} end
if r[1] ~= 'held' and r[1] ~= 'committed' then return {'resolved', r[1]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(r[2]) then return {'lease_ended', tonumber(r[2])} end
local lease_until = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'lease_until', lease_until)
if r[1] == 'held' then redis.call('ZADD', KEYS[2], lease_until, ARGV[2]) end
return {'ok', lease_until}
