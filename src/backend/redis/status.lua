-- status: KEYS = lock, fence, queue, waiters, legacy fence; no ARGV.
-- Returns {} when free, else
-- {owner, fence, acquired ms, remaining ms, now ms, queued waiters}.
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
return {holder, f, a, redis.call('PTTL', lock), now, redis.call('HLEN', KEYS[4])}
