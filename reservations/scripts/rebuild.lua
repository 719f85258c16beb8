-- Rebuild a mission's money state from the ledger's (after a failover or a Redis that lost its
-- data: docs/reservations.md), atomically, fenced like every script. Levels are summed again
-- from the reservations: held and expiring count reserved, committed committed, settled and
-- overrun their actual; released and expired nothing.
-- Where Redis holds more than the ledger it is kept: a reservation the record does not know
-- (listed in the holding index: an authorize or a Branch whose record never landed, the
-- reconciler's undecided ones) stays with its money counted, and one Redis moved further than
-- the record (committed, marked expiring or resolved by a Branch, same terms) keeps Redis's
-- state. What the ledger holds that Redis lost is written back.
-- KEYS[1] mission hash  KEYS[2] holding index  KEYS[3] leases zset  KEYS[3 + i] grant hashes
-- (i = 1..G)  then the ledger's reservation hashes (R), then the unrecorded ones (E)
-- ARGV[1] ceiling  ARGV[2] G  ARGV[3] R  ARGV[4] E  then per grant: id, budget, parent; then
-- B and B pairs (scope, blocking reservation); then per ledger reservation: id, amount, grant
-- chain (comma joined, leaf first), state, lease end (ms), actual ('' for none); then E ids
-- Reply {'ok', reserved, committed, settled (the mission's), kept from Redis, unrecorded kept}
-- or {'stale', ids...}: the holding index lists reservations not declared (call again).
local mission, holding, leases = KEYS[1], KEYS[2], KEYS[3]
local ng, nr, ne = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local a = 5
local grants, level = {}, {mission = {0, 0, 0}}
for i = 1, ng do
  grants[i] = {ARGV[a], ARGV[a + 1], ARGV[a + 2], KEYS[3 + i]}
  level[ARGV[a]] = {0, 0, 0}
  a = a + 3
end
local blocked = {}
local nb = tonumber(ARGV[a])
a = a + 1
for _ = 1, nb do
  blocked[ARGV[a]] = ARGV[a + 1]
  a = a + 2
end
local declared, rows = {}, {}
for i = 1, nr do
  declared[ARGV[a]] = true
  rows[i] = {KEYS[3 + ng + i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
    ARGV[a + 5]}
  a = a + 6
end
local extra = {}
for i = 1, ne do
  declared[ARGV[a]] = true
  extra[i] = {KEYS[3 + ng + nr + i], ARGV[a]}
  a = a + 1
end
local stale = {'stale'}
for _, rid in ipairs(redis.call('ZRANGE', holding, 0, -1)) do
  if not declared[rid] then stale[#stale + 1] = rid end
end
if #stale > 1 then return stale end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rank = {held = 1, committed = 2, expiring = 2, settled = 3, released = 3, expired = 3,
  overrun = 3}
local counted = {held = 1, committed = 2, expiring = 1}  -- 1: reserved, 2: committed
local final = {}  -- {key, id, amount, chain, state, lease, actual, seq}
local kept = 0
for _, r in ipairs(rows) do
  local key, rid, amount, chain, state, lease, actual = unpack(r)
  local h = redis.call('HMGET', key, 'amount', 'scopes', 'state', 'lease_until', 'actual', 'seq')
  if h[3] and rank[h[3]] and rank[state] < 3 and rank[h[3]] > rank[state]
      and h[1] == amount and h[2] == chain then
    state, lease, actual = h[3], h[4] or lease, h[5] or ''
    kept = kept + 1
  else
    redis.call('HSET', key, 'amount', amount, 'scopes', chain, 'state', state,
      'lease_until', lease)
    redis.call('HSETNX', key, 'at', now)
    redis.call('HSETNX', key, 'seq', 0)
    if state == 'committed' then redis.call('HSETNX', key, 'committed_at', now) end
    if rank[state] == 3 then
      if actual ~= '' then redis.call('HSET', key, 'actual', actual) end
      redis.call('HSETNX', key, 'resolved_at', now)
    end
  end
  final[#final + 1] = {key, rid, amount, chain, state, lease, actual, h[6] or 0}
end
for _, r in ipairs(extra) do
  local h = redis.call('HMGET', r[1], 'amount', 'scopes', 'state', 'lease_until', 'actual', 'seq')
  if h[3] and counted[h[3]] then
    final[#final + 1] = {r[1], r[2], h[1], h[2], h[3], h[4], h[5] or '', h[6] or 0}
  end
end
redis.call('DEL', holding, leases)
for _, f in ipairs(final) do
  local amount, state = tonumber(f[3]), f[5]
  local scopes = {'mission'}
  for gid in string.gmatch(f[4], '[^,]+') do scopes[#scopes + 1] = gid end
  for _, scope in ipairs(scopes) do
    local l = level[scope]
    if l then  -- a grant the record does not know: only its declared levels count it
      if counted[state] == 1 then l[1] = l[1] + amount
      elseif counted[state] == 2 then l[2] = l[2] + amount
      elseif (state == 'settled' or state == 'overrun') and f[7] ~= '' then
        l[3] = l[3] + tonumber(f[7])
      end
    end
  end
  if counted[state] then redis.call('ZADD', holding, tonumber(f[8]) or 0, f[2]) end
  if state == 'held' then redis.call('ZADD', leases, tonumber(f[6]), f[2]) end
end
local function write(key, scope, ceiling, parent)
  local l = level[scope]
  redis.call('HSET', key, 'ceiling', ceiling, 'reserved', l[1], 'committed', l[2],
    'settled', l[3])
  if parent then redis.call('HSET', key, 'parent', parent) end
  if blocked[scope] then redis.call('HSET', key, 'blocked', blocked[scope])
  else redis.call('HDEL', key, 'blocked') end
end
write(mission, 'mission', ARGV[1], nil)
redis.call('HSETNX', mission, 'seq', 0)
for _, g in ipairs(grants) do write(g[4], g[1], g[2], g[3]) end
local m = level.mission
return {'ok', m[1], m[2], m[3], kept, #extra}
