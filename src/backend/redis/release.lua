-- release: KEYS = lock, fence, queue, waiters; ARGV = owner
-- Returns 1 (released), 0 (not held), -1 (held by another owner).
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local current = redis.call('GET', lock)
if current then
  local flag, holder = string.match(current, '^(%d) %d+ %d+ %S+ (.+)$')
  if holder ~= ARGV[1] then
    return -1
  end
  if flag == '0' then
    -- Nobody queued: the fast path.
    redis.call('DEL', lock)
    return 1
  end
end

-- @helpers

-- Ours with waiters queued, or expired: the next live waiter gets it now
-- (its SET replaces our value); with none left, ours goes.
if not hand_off(nil, nil) and current then
  redis.call('DEL', lock)
end
if current then
  return 1
end
return 0
