-- Sweep, step one: mark held reservations whose lease has passed (by Redis time) `expiring`.
-- Their amounts are NOT returned: still counted, nobody can reserve that money, and a commit is
-- refused as for an ended lease. The ledger records their expiry, then `expire.lua` frees them.
-- Reservations marked by an earlier sweep whose free never came (a crash between the steps)
-- are returned again, so they are recorded and freed this time.
-- KEYS[1] leases zset   ARGV[1] key prefix   ARGV[2] most to return in one call
-- Returns {now, id1, amount1, scopes1, lease_until1, id2, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {now}
for _, id in ipairs(ids) do
  local key = ARGV[1] .. 'res:' .. id
  local r = redis.call('HMGET', key, 'amount', 'scopes', 'state', 'lease_until')
  if r[3] == 'held' or r[3] == 'expiring' then
    if r[3] == 'held' then redis.call('HSET', key, 'state', 'expiring', 'marked_at', now) end
    out[#out + 1] = id
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[4]
  else
    redis.call('ZREM', KEYS[1], id)  -- resolved already: a stale lease entry
  end
end
return out
