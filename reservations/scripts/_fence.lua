-- The fence of every script (prepended to each; docs/partitions.md): the last key is the
-- mission's epoch key (fl:{<mission>}:epoch, its hash tag), the last argument the caller's
-- partition epoch; both are taken off before the script's own body sees KEYS and ARGV.
-- An epoch below the stored one is refused (`fenced`: a newer owner took the partition over),
-- nothing written; a higher one is stored. 0: a caller that is no coordinator (a Branch).
local fence_epoch = tonumber(table.remove(ARGV))
local fence_key = table.remove(KEYS)
if fence_epoch > 0 then
  local fence_held = tonumber(redis.call('GET', fence_key) or '0')
  if fence_epoch < fence_held then
    return redis.error_reply('fenced: partition epoch ' .. fence_epoch .. ' is below ' ..
      fence_held .. ', a newer owner\'s')
  end
  if fence_epoch > fence_held then redis.call('SET', fence_key, fence_epoch) end
end
