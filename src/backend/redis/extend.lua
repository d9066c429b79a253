-- extend: KEYS = lock, meta, holds; ARGV = owner, ttl ms, fence of the
-- acquisition ('' = whichever the owner holds)
-- Returns {1, fence, acquired ms, now ms}, {0} (not held), {-1} (another
-- acquisition: another owner, or this owner under another fence).
local lock = KEYS[1]
local current = redis.call('GET', lock)
if not current then
  -- One of the shared holds or permits, if any (see common.lua).
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local all = redis.call('HGETALL', KEYS[3])
  local live = false
  for i = 1, #all, 2 do
    local field = all[i]
    if field ~= 'k' and string.byte(field, 1) ~= 109 then
      local expiry, a, attempt, grant, who = string.match(all[i + 1], '^(%d+) (%d+) (%S+) (%S+) (.+)$')
      if tonumber(expiry) > now then
        live = true
        if who == ARGV[1] and (ARGV[3] == '' or field == ARGV[3]) then
          local ttl = tonumber(ARGV[2])
          redis.call('HSET', KEYS[3], field,
            string.format('%d %s %s %s %s', now + ttl, a, attempt, grant, who))
          if redis.call('PTTL', KEYS[3]) < ttl then
            redis.call('PEXPIRE', KEYS[3], ttl)
          end
          return {1, field, a, now}
        end
      end
    end
  end
  if live then
    return {-1}
  end
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
