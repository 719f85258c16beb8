-- Admit one reservation and commit it in the same step: the authorise path of an action that
-- is about to run. Equivalent to reserve.lua followed by commit.lua (two transitions, two
-- `seq` values, so the ledger records both), in one round trip and with nothing in between.
-- KEYS[1] reservation hash fl:{m}:res:<id>; the mission, grant and leases keys share its prefix.
-- ARGV[1] amount   ARGV[2] lease (ms)   ARGV[3..] grant ids, leaf first
-- Reply: {'ok'|'dup'|'held', lease_until, reserved_at, reserved_seq, committed_at, committed_seq}
-- ('held': reserved by an earlier call that never committed; this call committed it.)
local prefix, rid = string.match(KEYS[1], '^(.*)res:(.+)$')
local leases = prefix .. 'leases'
local amount = tonumber(ARGV[1])
local names = {}
for i = 3, #ARGV do names[#names + 1] = ARGV[i] end
local csv = table.concat(names, ',')
local keys = {}
for i, name in ipairs(names) do keys[i] = prefix .. 'grant:' .. name end
keys[#keys + 1] = prefix .. 'mission'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function commit(lease_until, at, seq)
  for _, key in ipairs(keys) do
    redis.call('HINCRBY', key, 'reserved', 0 - amount)
    redis.call('HINCRBY', key, 'committed', amount)
  end
  local cseq = redis.call('HINCRBY', prefix .. 'mission', 'seq', 1)
  redis.call('HSET', KEYS[1], 'state', 'committed', 'committed_at', now, 'committed_seq', cseq)
  redis.call('ZREM', leases, rid)
  return {'ok', lease_until, at, seq, now, cseq}
end

local r = redis.call('HMGET', KEYS[1], 'amount', 'scopes', 'lease_until', 'state', 'at', 'seq',
  'committed_at', 'committed_seq')
if r[1] then
  if r[4] ~= 'held' and r[4] ~= 'committed' then return {'resolved', r[4]} end
  if r[1] ~= ARGV[1] or r[2] ~= csv then return {'conflict', r[1], r[2]} end
  if r[4] == 'committed' then
    return {'dup', tonumber(r[3]), tonumber(r[5]), tonumber(r[6] or 0), tonumber(r[7]),
      tonumber(r[8] or 0)}
  end
  -- Held by an earlier call that did not commit: commit it now, unless its lease has passed.
  if now >= tonumber(r[3]) then return {'lease_ended', tonumber(r[3])} end
  local reply = commit(tonumber(r[3]), tonumber(r[5]), tonumber(r[6] or 0))
  reply[1] = 'held'
  return reply
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
local seq = redis.call('HINCRBY', prefix .. 'mission', 'seq', 1)
redis.call('HSET', KEYS[1], 'amount', ARGV[1], 'scopes', csv, 'lease_until', lease_until,
  'state', 'held', 'at', now, 'seq', seq)
return commit(lease_until, now, seq)
