-- extend: KEYS = lock, meta; ARGV = owner, ttl ms, fence of the acquisition
-- ('' = whichever the owner holds)
-- Returns {1, fence, acquired ms, now ms}, {0} (not held), {-1} (another
-- acquisition: another owner, or this owner under another fence).
local lock = KEYS[1]
local current = redis.call('GET', lock)
if not current then
  return {0}
end
local f, a, holder = string.match(current, '^%d (%d+) (%d+) %S+ %S+ (.+)$')
if holder ~= ARGV[1] or (ARGV[3] ~= '' and f ~= ARGV[3]) then
  return {-1}
end
redis.call('PEXPIRE', lock, ARGV[2])
-- The metadata beside it (if any) lives as long.
if KEYS[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
local t = redis.call('TIME')
return {1, f, a, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
