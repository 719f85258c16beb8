-- The mission's branch reservations, for the coordinator to record what Redis did: a Branch
-- reserves with the list flag (reserve.lua), so every reservation it makes is listed here
-- until the coordinator has recorded its resolution, whether or not its worker survived.
-- KEYS[1] branches zset (reservation id -> reserve seq)   KEYS[1 + i] the reservation hash of
-- the i-th listed id (ARGV[u + 1 + i]; the client read them from the zset first)
-- ARGV[1] u: how many ids follow that the record holds resolved (unlisted first)
-- ARGV[2..u + 1] those ids   ARGV[u + 2..] the listed ids to read
-- Returns {now, id, amount, scopes, state, lease_until, at, seq, committed_at, committed_seq,
-- actual, resolved_at, resolved_seq, id2, ...}; '' for a field Redis does not hold.
local u = tonumber(ARGV[1])
for i = 2, u + 1 do redis.call('ZREM', KEYS[1], ARGV[i]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i = 2, #KEYS do
  local id = ARGV[u + i]
  local r = redis.call('HMGET', KEYS[i], 'amount', 'scopes', 'state',
    'lease_until', 'at', 'seq', 'committed_at', 'committed_seq', 'actual', 'resolved_at',
    'resolved_seq')
  if r[1] then
    out[#out + 1] = id
    for j = 1, 11 do out[#out + 1] = r[j] or '' end
  else
    redis.call('ZREM', KEYS[1], id)  -- never made (or its key was removed): nothing to record
  end
end
return out
