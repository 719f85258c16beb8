-- Sweep, step one: mark held reservations whose lease has passed (by Redis time) `expiring`.
-- Their amounts are NOT returned: still counted, nobody can reserve that money, and a commit is
-- refused as for an ended lease. The ledger records their expiry, then `expire.lua` frees them.
-- Reservations marked by an earlier sweep whose free never came (a crash between the steps)
-- are returned again, so they are recorded and freed this time.
-- KEYS[1] leases zset   KEYS[1 + i] the reservation hash of ARGV[i] (ids due.lua found; one
-- renewed since is left alone)
-- Returns {now, id1, amount1, scopes1, lease_until1, id2, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i, id in ipairs(ARGV) do
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= now then
    local key = KEYS[1 + i]
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
end
return out
