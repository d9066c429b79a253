-- extend: KEYS = lock, meta, holds, their expiries; ARGV = owner, ttl ms,
-- fence of the acquisition ('' = whichever the owner holds)
-- Returns {1, fence, acquired ms, now ms}, {0} (not held), {-1} (another
-- acquisition: another owner, or this owner under another fence).
local lock = KEYS[1]
local current = redis.call('GET', lock)
if not current then
  -- One of the shared holds or permits, if any (see common.lua).
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local field, value = ARGV[3], nil
  if field ~= '' then
    value = redis.call('HGET', KEYS[3], field)
  else
    -- Without a fence, whichever live hold the owner has: read them all.
    local all = redis.call('HGETALL', KEYS[3])
    for i = 1, #all, 2 do
      local b = string.byte(all[i], 1)
      if b >= 48 and b <= 57 and string.match(all[i + 1], '^%d+ %d+ %S+ %S+ (.+)$') == ARGV[1]
        and tonumber(string.match(all[i + 1], '^(%d+) ')) > now then
        field, value = all[i], all[i + 1]
        break
      end
    end
  end
  if value then
    local expiry, a, attempt, grant, who = string.match(value, '^(%d+) (%d+) (%S+) (%S+) (.+)$')
    if who == ARGV[1] and tonumber(expiry) > now then
      local ttl = tonumber(ARGV[2])
      expiry = string.format('%d', now + ttl)
      redis.call('HSET', KEYS[3], field,
        string.format('%s %s %s %s %s', expiry, a, attempt, grant, who))
      redis.call('ZADD', KEYS[4], expiry, field)
      if redis.call('PTTL', KEYS[3]) < ttl then
        redis.call('PEXPIRE', KEYS[3], ttl)
        redis.call('PEXPIRE', KEYS[4], ttl)
      end
      return {1, field, a, now}
    end
  end
  -- Not the owner's: another acquisition if any hold is live.
  if redis.call('ZCOUNT', KEYS[4], '(' .. string.format('%d', now), '+inf') > 0 then
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
