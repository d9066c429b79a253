-- acquire: KEYS = lock, fence, queue, waiters
-- ARGV = owner, ttl ms, wait ms (0 = do not queue), waiter id, channel
-- Returns {1, fence, acquired ms, now ms} or {0, holder's remaining ms}.
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, wait = ARGV[1], ARGV[2], tonumber(ARGV[3])

if redis.call('EXISTS', lock, queue) == 0 then
  -- Free and nobody waiting: the fast path.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local f = redis.call('INCR', fence)
  redis.call('SET', lock, string.format('0 %d %d - %s', f, now, owner), 'PX', ttl)
  return {1, f, now, now}
end

-- @helpers

local now = now_ms()
local current = redis.call('GET', lock)
if current then
  local _, f, a, _, holder = parse(current)
  if holder == owner then
    -- An idempotent retry, or a waiter that was handed the lock: same
    -- fence, TTL refreshed.
    redis.call('PEXPIRE', lock, ttl)
    if redis.call('HDEL', waiters, owner) == 1 then
      redis.call('LREM', queue, 1, owner)
    end
    return {1, f, a, now}
  end
else
  -- Free (released or expired) but waiters are queued: they come first.
  local f, who = hand_off(now, owner)
  if not f then
    f = take(owner, ttl, now, '0', '-')
    return {1, f, now, now}
  end
  if who == owner then
    return {1, f, now, now}
  end
end

if wait > 0 then
  -- Join the queue (or refresh our entry, keeping its place).
  local data = string.format('%d %s %s@%s', now + wait, ttl, ARGV[4], ARGV[5])
  if redis.call('HSET', waiters, owner, data) == 1 then
    redis.call('RPUSH', queue, owner)
  end
  -- The queue lives as long as its longest-waiting entry could matter.
  local keep = wait + 1000
  if redis.call('PTTL', queue) < keep then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', waiters, keep)
  end
  -- Tell the holder's release to hand off (the TTL is kept).
  redis.call('SETRANGE', lock, 0, '1')
end
return {0, redis.call('PTTL', lock)}
