-- metadata: KEYS = lock, meta; ARGV = owner, fence, metadata (JSON)
-- Stores "<fence> <metadata>" beside the lock, with the lock's TTL, if the
-- lock is still `owner`'s acquisition `fence`. Returns 1 if stored, else 0.
-- Safe to run twice. `status` shows the metadata only while its fence is
-- the lock's, so one left behind by an earlier holder is never shown.
local current = redis.call('GET', KEYS[1])
if not current then
  return 0
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
