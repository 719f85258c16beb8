-- Expire held reservations whose lease has passed (by Redis time); their amounts return.
-- KEYS[1] leases zset   ARGV[1] key prefix   ARGV[2] most to expire in one call
-- Returns {now, id1, amount1, scopes1, seq1, id2, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {now}
for _, id in ipairs(ids) do
  local key = ARGV[1] .. 'res:' .. id
  local r = redis.call('HMGET', key, 'amount', 'scopes', 'state')
  redis.call('ZREM', KEYS[1], id)
  if r[3] == 'held' then
    for gid in string.gmatch(r[2], '[^,]+') do
      redis.call('HINCRBY', ARGV[1] .. 'grant:' .. gid, 'reserved', 0 - tonumber(r[1]))
    end
    redis.call('HINCRBY', ARGV[1] .. 'mission', 'reserved', 0 - tonumber(r[1]))
    local seq = redis.call('HINCRBY', ARGV[1] .. 'mission', 'seq', 1)
    redis.call('HSET', key, 'state', 'expired', 'resolved_at', now, 'resolved_seq', seq)
    out[#out + 1] = id
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = seq
  end
end
return out
