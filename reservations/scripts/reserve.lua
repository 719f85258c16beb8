-- Admit one reservation against every level of its grant chain, or nothing at all; with the
-- commit flag, also commit it in the same step (the authorise path of an action about to run:
-- reserve then commit, two transitions and two `seq` values, one round trip).
-- Every check (existence, parent links, overrun blocks, ceilings) runs before the first write.
-- Every key it touches is declared (one hash tag, one Cluster slot):
-- KEYS[1] reservation hash   KEYS[2] holding index (zset: listed until it resolves, so
-- reconciliation finds what Redis holds without scanning)   KEYS[3] mission hash
-- KEYS[4] leases zset   KEYS[5] branches zset   KEYS[6..] grant hashes, leaf first
-- ARGV[1] amount   ARGV[2] lease (ms)   ARGV[3] commit ('1'), hold ('0'), or hold and list it
-- among the mission's branch reservations ('b': a Branch's, for the coordinator to record)
-- ARGV[4] reservation id   ARGV[5..] grant ids, leaf first (those of KEYS[6..])
-- Reply without commit: {'ok'|'dup', lease_until, reserved_at, reserved_seq}
-- Reply with commit: the same and committed_at, committed_seq; 'held' instead of 'dup' when
-- an earlier call reserved it without committing and this call committed it.
local res, holding, mission, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid = ARGV[4]
local amount = tonumber(ARGV[1])
local with_commit = ARGV[3] == '1'
local names, keys = {}, {}
for i = 5, #ARGV do
  names[#names + 1] = ARGV[i]
  keys[#keys + 1] = KEYS[i + 1]
end
local csv = table.concat(names, ',')
keys[#keys + 1] = mission
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function commit(tag, lease_until, at, seq)
  for _, key in ipairs(keys) do
    redis.call('HINCRBY', key, 'reserved', 0 - amount)
    redis.call('HINCRBY', key, 'committed', amount)
  end
  local cseq = redis.call('HINCRBY', mission, 'seq', 1)
  redis.call('HSET', res, 'state', 'committed', 'committed_at', now, 'committed_seq', cseq)
  redis.call('ZREM', leases, rid)
  return {tag, lease_until, at, seq, now, cseq}
end

local r = redis.call('HMGET', res, 'amount', 'scopes', 'lease_until', 'state', 'at', 'seq',
  'committed_at', 'committed_seq')
if r[1] then
  if r[4] ~= 'held' and r[4] ~= 'committed' and r[4] ~= 'expiring' then
    return {'resolved', r[4]}
  end
  if r[1] ~= ARGV[1] or r[2] ~= csv then return {'conflict', r[1], r[2]} end
  local lease_until, at, seq = tonumber(r[3]), tonumber(r[5]), tonumber(r[6] or 0)
  if not with_commit then return {'dup', lease_until, at, seq} end
  if r[4] == 'committed' then
    return {'dup', lease_until, at, seq, tonumber(r[7]), tonumber(r[8] or 0)}
  end
  if r[4] == 'expiring' or now >= lease_until then return {'lease_ended', lease_until} end
  return commit('held', lease_until, at, seq)
end
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
local lease_until = now + tonumber(ARGV[2])
for _, key in ipairs(keys) do redis.call('HINCRBY', key, 'reserved', ARGV[1]) end
-- The mission's transition counter orders the ledger records of concurrent writers.
local seq = redis.call('HINCRBY', mission, 'seq', 1)
redis.call('HSET', res, 'amount', ARGV[1], 'scopes', csv, 'lease_until', lease_until,
  'state', 'held', 'at', now, 'seq', seq)
redis.call('ZADD', holding, seq, rid)
if with_commit then return commit('ok', lease_until, now, seq) end
redis.call('ZADD', leases, lease_until, rid)
if ARGV[3] == 'b' then redis.call('ZADD', KEYS[5], seq, rid) end
return {'ok', lease_until, now, seq}
