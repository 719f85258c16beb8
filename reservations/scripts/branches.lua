-- The mission's branch reservations, for the coordinator to record what Redis did: a Branch
-- reserves with the list flag (reserve.lua), so every reservation it makes is listed here
-- until the coordinator has recorded its resolution, whether or not its worker survived.
-- KEYS[1] branches zset (reservation id -> reserve seq)   ARGV[1] key prefix
-- ARGV[2] most to return   ARGV[3..] ids the record holds resolved: unlisted first
-- Returns {now, id, amount, scopes, state, lease_until, at, seq, committed_at, committed_seq,
-- actual, resolved_at, resolved_seq, id2, ...}; '' for a field Redis does not hold.
for i = 3, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
for _, id in ipairs(ids) do
  local r = redis.call('HMGET', ARGV[1] .. 'res:' .. id, 'amount', 'scopes', 'state',
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
