-- Sweep, step zero (reads only): the held reservations whose lease has passed by Redis time,
-- so the sweep can declare their keys.
-- KEYS[1] leases zset   ARGV[1] most to return
-- Returns {now, id1, id2, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0,
    tonumber(ARGV[1]))) do
  out[#out + 1] = id
end
return out
