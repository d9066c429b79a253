-- claim: KEYS = lock, fence, queue, waiters, legacy fence, meta;
-- ARGV = owner, fence of the acquisition taken over, new attempt
-- Takes over `owner`'s acquisition `fence` as a new one (a token restored by
-- a job): a fresh fence, `attempt` recorded, expiry and metadata kept.
-- Returns {1, fence, acquired ms, remaining ms, now ms}, {0} (not held) or
-- {-1} (another acquisition holds it: the token was claimed already, or is
-- stale).
--
-- Safe to run twice: a run repeated after a lost reply finds the lock held
-- by `owner` under `attempt` (its own first run) and answers the same.
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local current = redis.call('GET', lock)
if not current then
  return {0}
end

-- @helpers

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
  local meta = redis.call('GET', KEYS[6])
  if meta and string.sub(meta, 1, #old + 1) == old .. ' ' then
    redis.call('SET', KEYS[6], f .. string.sub(meta, #old + 1), 'PX', ttl)
  end
end
return {1, f, a, ttl, now_ms()}
