-- claim: KEYS = lock, fence, queue, waiters, legacy fence, holds, their
-- expiries, meta;
-- ARGV = owner, fence of the acquisition taken over, new attempt
-- Takes over `owner`'s acquisition `fence` as a new one (a token restored by
-- a job): a fresh fence, `attempt` recorded, expiry and metadata kept.
-- Returns {1, fence, acquired ms, remaining ms, now ms}, {0} (not held) or
-- {-1} (another acquisition holds it: the token was claimed already, or is
-- stale).
--
-- Safe to run twice: a run repeated after a lost reply finds the lock held
-- by `owner` under `attempt` (its own first run) and answers the same.
local lock, fence, queue, waiters, holds, expiries = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7]
local current = redis.call('GET', lock)
if not current and redis.call('EXISTS', holds) == 0 then
  return {0}
end

-- @helpers

if not current then
  -- One of the shared holds or permits: the same, per hold (pruned first,
  -- so each one found is live).
  local now = now_ms()
  local n = prune(now)
  -- Claimed already by this very attempt (a repeated run), else the hold
  -- taken over.
  local f = redis.call('HGET', holds, 'a' .. ARGV[3] .. ' ' .. ARGV[1])
  local value = f and redis.call('HGET', holds, f)
  if not value then
    f = ARGV[2]
    value = redis.call('HGET', holds, f)
    if value and select(5, parse_hold(value)) ~= ARGV[1] then
      value = nil
    end
  end
  if not value then
    if n > 0 then
      return {-1}
    end
    return {0}
  end
  local expiry, a, attempt, grant, who = parse_hold(value)
  if attempt ~= ARGV[3] then
    local old = f
    -- The metadata belongs to the acquisition: it follows the new fence.
    local meta = redis.call('HGET', holds, 'm' .. old)
    f = string.format('%d', next_fence())
    -- The new expiry first: the index never empties, which would delete
    -- it, and the ZADD make it again without its TTL (kept forever).
    redis.call('ZADD', expiries, expiry, f)
    drop_hold(old, value)
    redis.call('HSET', holds, f, string.format('%s %s %s %s %s', expiry, a, ARGV[3], grant, who),
      'a' .. ARGV[3] .. ' ' .. who, f)
    if meta then
      redis.call('HSET', holds, 'm' .. f, meta)
    end
  end
  return {1, f, a, tonumber(expiry) - now, now}
end

local flag, f, a, grant, attempt, holder = parse(current)
if holder ~= ARGV[1] then
  return {-1}
end
local ttl = redis.call('PTTL', lock)
if ttl <= 0 then
  return {0}
end
if attempt ~= ARGV[3] then
  if f ~= ARGV[2] then
    return {-1}
  end
  local old = f
  f = string.format('%d', next_fence())
  redis.call('SET', lock,
    string.format('%s %s %s %s %s %s', flag, f, a, grant, ARGV[3], holder), 'PX', ttl)
  -- The metadata belongs to the acquisition: it follows the new fence.
  local meta = redis.call('GET', KEYS[8])
  if meta and string.sub(meta, 1, #old + 1) == old .. ' ' then
    redis.call('SET', KEYS[8], f .. string.sub(meta, #old + 1), 'PX', ttl)
  end
end
return {1, f, a, ttl, now_ms()}
