-- metadata: KEYS = lock, meta, holds, their expiries (unused); ARGV = owner,
-- fence, metadata (JSON)
-- Stores "<fence> <metadata>" beside the lock, with the lock's TTL, if the
-- lock is still `owner`'s acquisition `fence`. Returns 1 if stored, else 0.
-- Safe to run twice. `status` shows the metadata only while its fence is
-- the lock's, so one left behind by an earlier holder is never shown.
local current = redis.call('GET', KEYS[1])
if not current then
  -- A shared hold or permit keeps its metadata in the holds' hash, under
  -- 'm<fence>' (see common.lua).
  local hold = redis.call('HGET', KEYS[3], ARGV[2])
  if not hold then
    return 0
  end
  local expiry, who = string.match(hold, '^(%d+) %d+ %S+ %S+ (.+)$')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if who ~= ARGV[1] or tonumber(expiry) <= now then
    return 0
  end
  redis.call('HSET', KEYS[3], 'm' .. ARGV[2], ARGV[3])
  return 1
end
local f, holder = string.match(current, '^%d (%d+) %d+ %S+ %S+ (.+)$')
if f ~= ARGV[2] or holder ~= ARGV[1] then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[3], 'PX', ttl)
return 1
