-- leave: a waiter gives up. KEYS = lock, fence, queue, waiters, legacy fence
-- ARGV = owner, waiter id, channel, mode ('claim' or 'drop')
-- Leaves the queue; if the lock was handed to this waiter meanwhile, mode
-- 'claim' keeps it ({1, fence, acquired ms}) and 'drop' releases it to the
-- next waiter ({2}). Otherwise {0, holder's remaining ms}.
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- @helpers

local owner, ticket = ARGV[1], ARGV[2] .. '@' .. ARGV[3]
if redis.call('HDEL', waiters, ticket) == 1 then
  redis.call('LREM', queue, 1, ticket)
end

local current = redis.call('GET', lock)
if current then
  local _, f, a, g, _, holder = parse(current)
  if holder == owner and g == ticket then
    if ARGV[4] == 'claim' then
      return {1, f, a}
    end
    redis.call('DEL', lock)
    hand_off(nil, nil)
    return {2}
  end
end
return {0, redis.call('PTTL', lock)}
