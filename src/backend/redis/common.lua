-- tower-lock: helpers for the slow paths, spliced into a script at its
-- `-- @helpers` line (after its fast path, so the fast path never pays for
-- creating these closures). The script has declared `lock`, `fence`,
-- `queue`, `waiters` (KEYS[1..4]), `holds` (KEYS[6]) and `expiries`
-- (KEYS[7]); KEYS[5] is the lock's legacy fence counter. See mod.rs for the
-- layout.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- flag, fence, acquired ms, grant, attempt, owner
local function parse(value)
  return string.match(value, '^(%d) (%d+) (%d+) (%S+) (%S+) (.+)$')
end

-- The next fencing token: from the slot's counter, and above the lock's own
-- counter if a version before per-slot counters left one, which then goes
-- (its last value now lies below the slot's counter). While such versions
-- may still run, it is kept in step instead (legacy.rs).
local function next_fence()
  local f = redis.call('INCR', fence)
  local legacy = redis.call('GET', KEYS[5])
  if legacy then
    legacy = tonumber(legacy)
    if legacy and legacy >= f then
      f = legacy + 1
      redis.call('SET', fence, string.format('%d', f))
    end
    redis.call('DEL', KEYS[5])
  end
  return f
end

-- Make `owner` (its `attempt`) the holder for `ttl` ms with a fresh fencing
-- token.
local function take(owner, attempt, ttl, now, flag, grant)
  local f = next_fence()
  redis.call('SET', lock,
    string.format('%s %d %d %s %s %s', flag, f, now, grant, attempt, owner), 'PX', ttl)
  return f
end

-- The holds of a key held shared or under permits live in the hash `holds`:
-- 'k' = the kind ('s', or 'p<n>' for n permits), '<fence>' = "<expiry ms>
-- <acquired ms> <attempt> <grant> <owner>", 'm<fence>' = that hold's
-- metadata, 'a<attempt> <owner>' = the fence of that acquisition's hold (a
-- retry finds its own without reading the others). Beside it, the sorted set
-- `expiries` scores each hold's fence by its expiry: pruning touches only
-- the holds that ran out, the count is its size and the earliest expiry its
-- first score, so no script on the hot paths reads every hold. Expiries are
-- the server's clock; both keys live as long as their latest hold at least
-- (their TTL only grows), and go together with the last hold.
local function parse_hold(value)
  return string.match(value, '^(%d+) (%d+) (%S+) (%S+) (.+)$')
end

-- Both keys live at least `ttl` ms more (they share one TTL). Set to twice
-- that when short, so that holds of one TTL coming and going renew it once
-- per TTL, not on every hold.
local function keep_holds(ttl)
  if redis.call('PTTL', holds) < ttl then
    redis.call('PEXPIRE', holds, 2 * ttl)
    redis.call('PEXPIRE', expiries, 2 * ttl)
  end
end

-- Forget hold `f` (its stored `value`): its fields, its index entry (unless
-- that names another hold) and its expiry.
local function drop_hold(f, value)
  local _, _, attempt, _, who = parse_hold(value)
  local index = 'a' .. attempt .. ' ' .. who
  if redis.call('HGET', holds, index) == f then
    redis.call('HDEL', holds, f, 'm' .. f, index)
  else
    redis.call('HDEL', holds, f, 'm' .. f)
  end
  redis.call('ZREM', expiries, f)
end

-- Drop the holds that ran out by `now` (both keys go with the last one).
-- Returns the number of live holds.
local function prune(now)
  local gone = redis.call('ZRANGEBYSCORE', expiries, '-inf', string.format('%d', now))
  for i = 1, #gone do
    local value = redis.call('HGET', holds, gone[i])
    if value then
      drop_hold(gone[i], value)
    else
      redis.call('ZREM', expiries, gone[i])
    end
  end
  local n = redis.call('ZCARD', expiries)
  if n == 0 then
    redis.call('DEL', holds, expiries)
  end
  return n
end

-- The kind of the `n` live holds ('' when none).
local function kind_held(n)
  if n == 0 then
    return ''
  end
  return redis.call('HGET', holds, 'k') or ''
end

-- The earliest expiry among the holds (pruned first), or nil.
local function earliest()
  local first = redis.call('ZRANGE', expiries, 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

-- Every live hold (pruned first), {fence, value, ...}: for the rare paths
-- that look a hold up by something no index has.
local function live_holds(now)
  prune(now)
  local all, live = redis.call('HGETALL', holds), {}
  for i = 1, #all, 2 do
    local b = string.byte(all[i], 1)
    if b >= 48 and b <= 57 then
      live[#live + 1] = all[i]
      live[#live + 1] = all[i + 1]
    end
  end
  return live
end

-- The live hold of `owner` under fence `f` ('' = any of the owner's), if
-- any: its fence and stored value (not pruned: the caller prunes after).
local function hold_of(owner, f, now)
  if f == '' then
    -- A cleanup without a fence: the one release that reads every hold.
    local live = live_holds(now)
    for i = 1, #live, 2 do
      if select(5, parse_hold(live[i + 1])) == owner then
        return live[i], live[i + 1]
      end
    end
    return nil
  end
  local value = redis.call('HGET', holds, f)
  if value then
    local expiry, _, _, _, who = parse_hold(value)
    if who == owner and tonumber(expiry) > now then
      return f, value
    end
  end
  return nil
end

-- Whether a request of `kind` ('' exclusive, 's' shared, 'p<n>') and holds
-- of kind `held` can be on one key (held together or queued).
local function same_family(kind, held)
  if string.byte(kind, 1) == 112 or string.byte(held, 1) == 112 then
    return kind == held
  end
  return true
end

-- Whether a new hold of `kind` fits beside `n` live holds of kind `held`.
local function fits(kind, held, n)
  if n == 0 then
    return true
  end
  if kind == 's' then
    return held == 's'
  end
  if string.byte(kind, 1) == 112 then
    return kind == held and n < tonumber(string.sub(kind, 2))
  end
  return false
end

-- Add a hold of `kind` for `owner` (its `attempt`), `ttl` ms from `now`,
-- with a fresh fencing token; `grant` as in the lock's value.
local function add_hold(kind, owner, attempt, ttl, now, grant)
  local f = string.format('%d', next_fence())
  ttl = tonumber(ttl)
  local expiry = string.format('%d', now + ttl)
  redis.call('HSET', holds, 'k', kind,
    f, string.format('%s %d %s %s %s', expiry, now, attempt, grant, owner),
    'a' .. attempt .. ' ' .. owner, f)
  redis.call('ZADD', expiries, expiry, f)
  keep_holds(ttl)
  return f
end

-- Publish `message` (after the waiter's id) to the waiter of `ticket`.
local function tell(ticket, prefix, message)
  local id, chan = string.match(ticket, '^(%d+)@(.+)$')
  -- A channel with a hash tag is a cluster's shard channel, in this
  -- lock's slot: sharded pub/sub reaches its subscriber on this
  -- shard without crossing the cluster bus.
  local publish = 'PUBLISH'
  if string.find(chan, '{', 1, true) then
    publish = 'SPUBLISH'
  end
  redis.call(publish, chan, prefix .. id .. ' ' .. message)
end

-- Tell the waiter of `ticket` it was handed the lock (fence `f`).
local function wake(ticket, f, now)
  tell(ticket, '', string.format('%s %d', f, now))
end

-- Tell the first live waiter of the queue (among its first ten), unless it
-- is `me`, how long until what now blocks it may end ('w <id> <ms>': the
-- exclusive holder's expiry, else the earliest hold's). A waiter sleeps
-- until the expiry its last attempt saw; a hand-off changes who holds and
-- until when, and a TTL that runs out tells nobody: without this, a head
-- behind a holder that was handed the lock and walked away slept on the
-- old holder's expiry (or its safety-net re-check, up to 2 s).
local function nudge(now, me)
  local tickets = redis.call('LRANGE', queue, 0, 9)
  for i = 1, #tickets do
    local data = redis.call('HGET', waiters, tickets[i])
    local deadline = data and string.match(data, '^(%d+) ')
    if deadline and tonumber(deadline) > now then
      if tickets[i] ~= me then
        local left = redis.call('PTTL', lock)
        if left < 0 then
          left = (earliest() or now) - now
        end
        tell(tickets[i], 'w ', string.format('%d', math.max(left, 0)))
      end
      return
    end
  end
end

-- Hand what is free of the key (no exclusive holder: the caller checked or
-- deleted it) to the queue, oldest first: the head, and after it every
-- waiter that fits beside what is held (consecutive shared waiters, permits
-- while there is room), stopping at the first that does not. Waiters whose
-- own deadline passed are skipped. Waiters are queued by ticket
-- ("<waiter id>@<channel>", see mod.rs); each one granted is told through its
-- instance's channel ("<waiter id> <fence> <acquired ms>"), unless its
-- ticket is `me`, the caller of this very script. `n`: the number of live
-- holds, when the caller pruned them already. Returns the fence granted to
-- `me` (or nil), whether anything was granted, and whether the queue was
-- found empty.
local function hand_off(now, me, n)
  now = now or now_ms()
  n = n or prune(now)
  -- The kind held, read once a waiter is at the head.
  local held = nil
  local mine, any = nil, false
  while true do
    local ticket = redis.call('LINDEX', queue, 0)
    if not ticket then
      return mine, any, true
    end
    held = held or kind_held(n)
    local data = redis.call('HGET', waiters, ticket)
    local deadline, ttl, attempt, who, kind
    if data then
      deadline, ttl, attempt, who, kind = string.match(data, '^(%d+) (%d+) (%S+) (%S+) ?(%S*)$')
    end
    if not deadline or tonumber(deadline) <= now then
      redis.call('LPOP', queue)
      if data then
        redis.call('HDEL', waiters, ticket)
      end
    elseif not fits(kind, held, n) then
      -- Not its turn yet: it stays at the head.
      break
    else
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, ticket)
      local f
      if kind == '' then
        f = string.format('%d', take(who, attempt, ttl, now, '1', ticket))
      else
        f = add_hold(kind, who, attempt, ttl, now, ticket)
      end
      any = true
      if ticket == me then
        mine = f
      else
        wake(ticket, f, now)
      end
      if kind == '' then
        break
      end
      held, n = kind, n + 1
    end
  end
  if any then
    nudge(now, me)
  end
  return mine, any, false
end

