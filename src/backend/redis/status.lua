-- status: KEYS = lock, fence, queue, waiters, legacy fence[, meta]; no ARGV.
-- Returns {} when free, else
-- {owner, fence, acquired ms, remaining ms, now ms, queued waiters[, metadata]}.
local lock = KEYS[1]
local current = redis.call('GET', lock)
if not current then
  return {}
end
local f, a, holder = string.match(current, '^%d (%d+) (%d+) %S+ %S+ (.+)$')
if not holder then
  return redis.error_reply('tower-lock: unreadable lock value')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {holder, f, a, redis.call('PTTL', lock), now, redis.call('HLEN', KEYS[4])}
-- Metadata stored for this very acquisition (meta.lua), if any.
local meta = KEYS[6] and redis.call('GET', KEYS[6])
if meta and string.match(meta, '^(%d+) ') == f then
  reply[7] = string.sub(meta, #f + 2)
end
return reply
