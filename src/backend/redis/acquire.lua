-- acquire: KEYS = lock, fence (the slot's counter), queue, waiters, legacy
-- fence (the lock's own counter of versions before per-slot counters),
-- holds (shared holds and permits), then, in the variant for shared holds
-- and permits, their expiries (keys.rs: the exclusive acquire names it)
-- ARGV = ttl ms, "<caller's clock ms> <grant> <attempt> <owner>" (the tail
-- of the value the fast path stores: one argument less than sending them
-- apart, which is cheaper; grant: a waiter's ticket, else '-'), then, for a waiter: wait ms (0 = do not queue), waiter
-- id, channel ('' for none); in the variant for shared holds and permits
-- (scripts.rs), then the kind ('s' or 'p<n>').
-- Returns the fence (an integer) when taken on the fast path (free, nobody
-- waiting), else {1, fence, acquired ms, now ms},
-- {0, holder's remaining ms, 1 if this call created a queue entry else 0},
-- {2, 0, 0}: held by a kind that cannot meet this one (never queued), or
-- {3, 0, 0}: the waiter of this ticket left for good (below).

-- A waiter's attempt (it carries a ticket) after that waiter left for good:
-- a 'drop' leave marked its ticket (leave.lua). The attempt was in flight
-- on a stalled connection while the leave went out on another, and lands
-- late: it takes and queues nothing (it would take the lock for a waiter
-- that is gone, until its TTL). {3, 0, 0}.
if ARGV[5] and ARGV[5] ~= '' and ARGV[3] ~= '0' and redis.call('ZSCORE', KEYS[4] .. 'x', ARGV[4] .. '@' .. ARGV[5]) then
  return {3, 0, 0}
end

if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5], KEYS[6]) == 0 then
  -- Free, nobody waiting and no legacy counter to migrate: the fast path.
  -- No `TIME` and a bare integer
  -- reply: together they were a third of this script's server time. The
  -- stored acquisition time is the caller's (only `status` shows it).
  -- Measured cheaper than the obvious spelling: no locals (`KEYS[i]` and
  -- `ARGV[i]` directly), `..` rather than `string.format`, and `PSETEX`
  -- rather than `SET ... PX` (one argument less, no option parsing).
  -- @kinds-fast-path
  local f = redis.call('INCR', KEYS[2])
  if f < 1e14 then
    -- `..` writes a number with %.14g: exact below 1e14.
    redis.call('PSETEX', KEYS[1], ARGV[1], '0 ' .. f .. ' ' .. ARGV[2])
  else
    redis.call('PSETEX', KEYS[1], ARGV[1], string.format('0 %d %s', f, ARGV[2]))
  end
  return f
end

local lock, fence, queue, waiters, holds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
-- The holds' expiry index: sent by the variant for shared holds and
-- permits; the exclusive acquire is sent one key less (its fast path never
-- needs it) and names it beside the holds (same hash tag, same slot).
local expiries = KEYS[7] or holds .. 'e'
local ttl = ARGV[1]
-- A hold this call takes is its ticket's to give back (leave.lua), should
-- the call be dropped before it reads this reply; '-': nobody's.
local grant_mine, attempt, owner = string.match(ARGV[2], '^%d+ (%S+) (%S+) (.+)$')
-- '' exclusive; the variant for other kinds reads it from ARGV[6].
local kind = ''
-- This caller's queue ticket, if it is a waiter.
local ticket = nil
if ARGV[5] and ARGV[5] ~= '' then
  ticket = ARGV[4] .. '@' .. ARGV[5]
end

-- @helpers

-- Out of the queue: this caller was handed the lock, or takes it.
local function dequeue()
  if ticket and redis.call('HDEL', waiters, ticket) == 1 then
    redis.call('LREM', queue, 1, ticket)
  end
end

local now = now_ms()
local current = redis.call('GET', lock)
local first = nil
if current then
  local flag, f, a, grant, held_attempt, holder = parse(current)
  if holder == owner and held_attempt == attempt and kind == '' then
    -- A retry of the holder's own attempt, or a waiter that was handed the
    -- lock: same fence, TTL refreshed. The same owner token with another
    -- attempt (or kind) is someone else (below). The hold is this call's now: a
    -- grant to another call's ticket (this request's first call, handed
    -- the lock and dropped before it read it) is no longer that ticket's
    -- to give back when it leaves (leave.lua), or it would release the
    -- hold under this call. Nor this call's (its own 'drop' leave would
    -- release it under that other call, if that one read it): nobody's. A
    -- grant to this call's own ticket stays its own to give back.
    if grant ~= '-' and grant ~= ticket then
      redis.call('SET', lock,
        string.format('%s %s %s - %s %s', flag, f, a, held_attempt, holder), 'PX', ttl)
    else
      redis.call('PEXPIRE', lock, ttl)
    end
    dequeue()
    return {1, f, a, now}
  end
  if not same_family(kind, '') then
    return {2, 0, 0}
  end
else
  -- A retry of one of the holds (or a waiter handed one): same fence, TTL
  -- refreshed. Found through its index entry: pruned first, so it is live.
  local n = prune(now)
  local f = redis.call('HGET', holds, 'a' .. attempt .. ' ' .. owner)
  local value = f and redis.call('HGET', holds, f)
  -- (Of this kind: a request of another kind under the same owner and
  -- attempt is another acquisition, which taken for this one would
  -- believe it held the lock exclusive beside readers.)
  if value and redis.call('HGET', holds, 'k') ~= kind then
    value = nil
  end
  if value then
    local _, a, held_attempt, grant, who = parse_hold(value)
    local expiry = string.format('%d', now + tonumber(ttl))
    -- This call's now, as above: no other ticket's to give back.
    if grant ~= ticket then
      grant = '-'
    end
    redis.call('HSET', holds, f,
      string.format('%s %s %s %s %s', expiry, a, held_attempt, grant, who))
    redis.call('ZADD', expiries, expiry, f)
    keep_holds(tonumber(ttl))
    dequeue()
    return {1, f, a, now}
  end
  -- Free (released or expired) or with room, but waiters are queued: they
  -- come first.
  local mine, any, empty = hand_off(now, ticket, n)
  if mine then
    return {1, mine, now, now}
  end
  if any then
    -- Handed to others: what they hold now.
    current = redis.call('GET', lock)
    n = prune(now)
    empty = redis.call('LLEN', queue) == 0
  end
  if current then
    if not same_family(kind, '') then
      return {2, 0, 0}
    end
  else
    local held = kind_held(n)
    if n > 0 and not same_family(kind, held) then
      return {2, 0, 0}
    end
    -- Nobody live is queued (the hand-off left a live head otherwise).
    if empty and fits(kind, held, n) then
      local f
      if kind == '' then
        f = take(owner, attempt, ttl, now, '0', grant_mine)
      else
        f = add_hold(kind, owner, attempt, ttl, now, grant_mine)
      end
      dequeue()
      return {1, f, now, now}
    end
    first = earliest()
  end
end

local created = 0
local wait = tonumber(ARGV[3] or '0')
if wait > 0 and ticket then
  -- Join the queue (or refresh our entry, keeping its place).
  local data = string.format('%d %s %s %s', now + wait, ttl, attempt, owner)
  if kind ~= '' then
    data = data .. ' ' .. kind
  end
  if redis.call('HSET', waiters, ticket, data) == 1 then
    redis.call('RPUSH', queue, ticket)
    created = 1
  end
  -- The queue lives as long as its longest-waiting entry could matter.
  local keep = wait + 1000
  if redis.call('PTTL', queue) < keep then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', waiters, keep)
  end
  if current then
    -- Tell the holder's release to hand off (the TTL is kept).
    redis.call('SETRANGE', lock, 0, '1')
  end
end
if current then
  return {0, redis.call('PTTL', lock), created}
end
-- Held by shared holds or permits: the first of them to end.
return {0, (first or now) - now, created}
