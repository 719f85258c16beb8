-- Sweep, step two: free reservations whose expiry the ledger has recorded (idempotent by id).
-- A held or expiring reservation's amount returns; one already expired is a repeat, and so is
-- an id named twice (its money returns once).
-- KEYS[1] leases zset   KEYS[2] holding index (an expired reservation leaves it)
-- KEYS[3] mission hash   KEYS[3 + i] the reservation hash of ARGV[1 + i], i = 1..ARGV[1]
-- KEYS[4 + n..] the grant hashes of ARGV[2 + n..] (n = ARGV[1]): every grant of their chains
-- Returns {now, id1, tag1, amount1, scopes1, seq1, ...}; tag 'ok', 'dup', 'missing' or the
-- state that kept it (a committed or otherwise resolved reservation is left alone).
-- A chain naming an undeclared grant writes nothing: {'chain', id1, chain1, ...}.
local n = tonumber(ARGV[1])
local grants = {}
for j = 2 + n, #ARGV do grants[ARGV[j]] = KEYS[j + 2] end
local rows, stale = {}, {'chain'}
for i = 1, n do
  local r = redis.call('HMGET', KEYS[3 + i], 'amount', 'scopes', 'state', 'resolved_seq')
  rows[i] = r
  if r[3] == 'held' or r[3] == 'expiring' then
    for gid in string.gmatch(r[2], '[^,]+') do
      if not grants[gid] then
        stale[#stale + 1] = ARGV[1 + i]
        stale[#stale + 1] = r[2]
        break
      end
    end
  end
end
if #stale > 1 then return stale end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out, freed = {now}, {}
for i = 1, n do
  local id, r = ARGV[1 + i], rows[i]
  local tag, seq = r[3] or 'missing', tonumber(r[4] or 0)
  if freed[id] then  -- named twice: its row was read before this call freed it
    tag, seq = 'dup', freed[id]
  elseif r[3] == 'held' or r[3] == 'expiring' then
    for gid in string.gmatch(r[2], '[^,]+') do
      redis.call('HINCRBY', grants[gid], 'reserved', 0 - tonumber(r[1]))
    end
    redis.call('HINCRBY', KEYS[3], 'reserved', 0 - tonumber(r[1]))
    seq = redis.call('HINCRBY', KEYS[3], 'seq', 1)
    redis.call('HSET', KEYS[3 + i], 'state', 'expired', 'resolved_at', now, 'resolved_seq', seq)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    tag = 'ok'
    freed[id] = seq
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
