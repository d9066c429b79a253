-- acquire: KEYS = lock, fence, queue, waiters
-- ARGV = ttl ms, "<caller's clock ms> - <owner>" (the tail of the value the
-- fast path stores: one argument less than sending both, which is cheaper),
-- then to queue when busy: wait ms, waiter id, channel (absent = do not
-- queue).
-- Returns the fence (an integer) when taken on the fast path (free, nobody
-- waiting), else {1, fence, acquired ms, now ms} or {0, holder's remaining ms}.

if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  -- Free and nobody waiting: the fast path. No `TIME` and a bare integer
  -- reply: together they were a third of this script's server time. The
  -- stored acquisition time is the caller's (only `status` shows it).
  -- Measured cheaper than the obvious spelling: no locals (`KEYS[i]` and
  -- `ARGV[i]` directly), `..` rather than `string.format`, and `PSETEX`
  -- rather than `SET ... PX` (one argument less, no option parsing).
  local f = redis.call('INCR', KEYS[2])
  if f < 1e14 then
    -- `..` writes a number with %.14g: exact below 1e14.
    redis.call('PSETEX', KEYS[1], ARGV[1], '0 ' .. f .. ' ' .. ARGV[2])
  else
    redis.call('PSETEX', KEYS[1], ARGV[1], string.format('0 %d %s', f, ARGV[2]))
  end
  return f
end

local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ttl = ARGV[1]
-- The owner follows the clock (digits) and ' - '.
local owner = string.sub(ARGV[2], string.find(ARGV[2], ' ', 1, true) + 3)

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

local wait = tonumber(ARGV[3] or '0')
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
