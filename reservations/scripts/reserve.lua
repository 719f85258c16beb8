-- Admit one reservation against every level of its grant chain, or nothing at all.
-- Every check (existence, parent links, overrun blocks, ceilings) runs before the first write.
-- KEYS[1] reservation hash   KEYS[2] leases zset   KEYS[3] mission hash
-- KEYS[4..] grant hashes, leaf first
-- ARGV[1] reservation id   ARGV[2] amount   ARGV[3] lease (ms)   ARGV[4] chain csv (leaf first)
-- ARGV[5..] grant ids, leaf first (names for KEYS[4..])
local amount = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'lease_until', 'state', 'at', 'seq')
if r[1] then
  if r[1] == ARGV[2] and r[2] == ARGV[4] then
    return {'dup', tonumber(r[3]), tonumber(r[5]), tonumber(r[6] or 0)}
  end
  return {'conflict', r[1], r[2]}
end
local keys, names = {}, {}
for i = 4, #KEYS do
  keys[#keys + 1] = KEYS[i]
  names[#names + 1] = ARGV[i + 1]
end
keys[#keys + 1] = KEYS[3]
names[#names + 1] = 'mission'
local levels = {}
for i, key in ipairs(keys) do
  local h = redis.call('HMGET', key, 'ceiling', 'reserved', 'committed', 'settled', 'parent',
    'blocked')
  if not h[1] then return {'missing', names[i]} end
  if i < #keys and h[5] ~= names[i + 1] then
    return {'parent', names[i], h[5] or '', names[i + 1]}
  end
  levels[i] = h
end
for i, h in ipairs(levels) do
  if h[6] then return {'blocked', names[i], h[6]} end
end
for i, h in ipairs(levels) do
  local ceiling = tonumber(h[1])
  local used = tonumber(h[2]) + tonumber(h[3]) + tonumber(h[4])
  if used + amount > ceiling then return {'deny', names[i], ceiling - used, ceiling} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now + tonumber(ARGV[3])
for _, key in ipairs(keys) do redis.call('HINCRBY', key, 'reserved', ARGV[2]) end
-- The mission's transition counter orders the ledger records of concurrent writers.
local seq = redis.call('HINCRBY', KEYS[3], 'seq', 1)
redis.call('HSET', KEYS[1], 'amount', ARGV[2], 'scopes', ARGV[4], 'lease_until', lease_until,
  'state', 'held', 'at', now, 'seq', seq)
redis.call('ZADD', KEYS[2], lease_until, ARGV[1])
return {'ok', lease_until, now, seq}
