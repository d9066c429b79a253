-- leave: a waiter gives up. KEYS = lock, fence, queue, waiters, legacy fence,
-- holds, their expiries
-- ARGV = owner, waiter id, channel, mode ('claim' or 'drop'), how long a
-- dropped waiter's ticket stays marked (ms)
-- Leaves the queue; if the lock was handed to this waiter meanwhile, mode
-- 'claim' keeps it ({1, fence, acquired ms}) and 'drop' releases it to the
-- next waiter ({2}). Otherwise {0, holder's remaining ms}.
local lock, fence, queue, waiters, holds, expiries = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7]

-- @helpers

local owner, ticket = ARGV[1], ARGV[2] .. '@' .. ARGV[3]
if redis.call('HDEL', waiters, ticket) == 1 then
  redis.call('LREM', queue, 1, ticket)
end
if ARGV[4] == 'drop' then
  -- The waiter is gone for good. An attempt of it may still be in flight
  -- on a stalled connection (this leave went out on another): marked for
  -- as long as such a call may land (ARGV[5]; a minute from a client that
  -- does not say), the ticket makes that attempt take nothing when it
  -- lands (acquire.lua).
  local marks, at = waiters .. 'x', now_ms()
  local life = tonumber(ARGV[5] or '60000')
  redis.call('ZREMRANGEBYSCORE', marks, '-inf', at)
  redis.call('ZADD', marks, at + life, ticket)
  if redis.call('PTTL', marks) < life then
    redis.call('PEXPIRE', marks, life)
  end
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
if current then
  return {0, redis.call('PTTL', lock)}
end
-- Shared holds or permits: one of them handed to this waiter, or none (no
-- index names a hold by its grant: a waiter giving up reads them all).
-- Or no holds at all: free (its holder's TTL ran out, nobody released it),
-- and the waiters behind this one come in below, now, not at their own
-- re-checks (up to their safety net's 2 s later).
local now = now_ms()
local live = live_holds(now)
for i = 1, #live, 2 do
  local _, a, _, grant, who = parse_hold(live[i + 1])
  if who == owner and grant == ticket then
    if ARGV[4] == 'claim' then
      return {1, live[i], a}
    end
    drop_hold(live[i], live[i + 1])
    hand_off(now, nil)
    return {2}
  end
end
-- Leaving may let the waiters behind this one in (readers behind a writer
-- that gave up; anyone behind it on a key left free).
hand_off(now, nil)
local n = prune(now)
if n == 0 then
  return {0, redis.call('PTTL', lock)}
end
return {0, earliest() - now}
