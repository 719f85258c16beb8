-- Sweep, step two: free reservations whose expiry the ledger has recorded (idempotent by id).
-- A held or expiring reservation's amount returns; one already expired is a repeat.
-- KEYS[1] leases zset   KEYS[2] holding index (an expired reservation leaves it)
-- ARGV[1] key prefix   ARGV[2..] reservation ids
-- Returns {now, id1, tag1, amount1, scopes1, seq1, ...}; tag 'ok', 'dup', 'missing' or the
-- state that kept it (a committed or otherwise resolved reservation is left alone).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i = 2, #ARGV do
  local id = ARGV[i]
  local key = ARGV[1] .. 'res:' .. id
  local r = redis.call('HMGET', key, 'amount', 'scopes', 'state', 'resolved_seq')
  local tag, seq = r[3] or 'missing', tonumber(r[4] or 0)
  if r[3] == 'held' or r[3] == 'expiring' then
    for gid in string.gmatch(r[2], '[^,]+') do
      redis.call('HINCRBY', ARGV[1] .. 'grant:' .. gid, 'reserved', 0 - tonumber(r[1]))
    end
    redis.call('HINCRBY', ARGV[1] .. 'mission', 'reserved', 0 - tonumber(r[1]))
    seq = redis.call('HINCRBY', ARGV[1] .. 'mission', 'seq', 1)
    redis.call('HSET', key, 'state', 'expired', 'resolved_at', now, 'resolved_seq', seq)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    tag = 'ok'
  elseif r[3] == 'expired' then
    tag = 'dup'
  end
  out[#out + 1] = id
  out[#out + 1] = tag
  out[#out + 1] = r[1] or '0'
  out[#out + 1] = r[2] or ''
  out[#out + 1] = seq
end
return out
