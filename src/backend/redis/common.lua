-- tower-lock: helpers for the slow paths, spliced into a script at its
-- `-- @helpers` line (after its fast path, so the fast path never pays for
-- creating these closures). The script has declared `lock`, `fence`,
-- `queue`, `waiters` (KEYS[1..4]) and `holds` (KEYS[6]); KEYS[5] is the
-- lock's legacy fence counter. See mod.rs for the layout.

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
-- metadata. Expiries are the server's clock; the hash lives as long as its
-- latest hold, and every script that reads it skips holds that ran out.
local function parse_hold(value)
  return string.match(value, '^(%d+) (%d+) (%S+) (%S+) (.+)$')
end

-- Drop the holds that ran out by `now` (the hash goes with the last one).
-- Returns the kind ('' when no hold is live), the number of live holds, the
-- earliest expiry among them, and them: {fence, value, ...}.
local function prune(now)
  local all = redis.call('HGETALL', holds)
  if #all == 0 then
    return '', 0, nil, {}
  end
  local kind, n, first, last, live = '', 0, nil, 0, {}
  for i = 1, #all, 2 do
    local field, value = all[i], all[i + 1]
    if field == 'k' then
      kind = value
    elseif string.byte(field, 1) ~= 109 then
      -- A hold ('m...' is metadata).
      local expiry = tonumber(string.match(value, '^(%d+) '))
      if expiry > now then
        n = n + 1
        if not first or expiry < first then
          first = expiry
        end
        if expiry > last then
          last = expiry
        end
        live[#live + 1] = field
        live[#live + 1] = value
      else
        redis.call('HDEL', holds, field, 'm' .. field)
      end
    end
  end
  if n == 0 then
    redis.call('DEL', holds)
    return '', 0, nil, live
  end
  redis.call('PEXPIRE', holds, last - now)
  return kind, n, first, live
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
  redis.call('HSET', holds, 'k', kind,
    f, string.format('%d %d %s %s %s', now + ttl, now, attempt, grant, owner))
  if redis.call('PTTL', holds) < ttl then
    redis.call('PEXPIRE', holds, ttl)
  end
  return f
end

-- Tell the waiter of `ticket` it was handed the lock (fence `f`).
local function wake(ticket, f, now)
  local id, chan = string.match(ticket, '^(%d+)@(.+)$')
  -- A channel with a hash tag is a cluster's shard channel, in this
  -- lock's slot: sharded pub/sub reaches its subscriber on this
  -- shard without crossing the cluster bus.
  local publish = 'PUBLISH'
  if string.find(chan, '{', 1, true) then
    publish = 'SPUBLISH'
  end
  redis.call(publish, chan, string.format('%s %s %d', id, f, now))
end

-- Hand what is free of the key (no exclusive holder: the caller checked or
-- deleted it) to the queue, oldest first: the head, and after it every
-- waiter that fits beside what is held (consecutive shared waiters, permits
-- while there is room), stopping at the first that does not. Waiters whose
-- own deadline passed are skipped. Waiters are queued by ticket
-- ("<waiter id>@<channel>", see mod.rs); each one granted is told through its
-- instance's channel ("<waiter id> <fence> <acquired ms>"), unless its
-- ticket is `me`, the caller of this very script. Returns the fence granted
-- to `me` (or nil), and whether anything was granted.
local function hand_off(now, me)
  now = now or now_ms()
  local held, n = prune(now)
  local mine, any = nil, false
  while true do
    local ticket = redis.call('LINDEX', queue, 0)
    if not ticket then
      break
    end
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
  return mine, any
end

-- The live hold of `owner` under fence `f` ('' = any of the owner's), if
-- any: its fence and fields; else nil and whether any hold is live.
local function find_hold(owner, f, now)
  local _, n, _, live = prune(now)
  for i = 1, #live, 2 do
    local expiry, a, attempt, grant, who = parse_hold(live[i + 1])
    if who == owner and (f == '' or live[i] == f) then
      return live[i], expiry, a, attempt, grant
    end
  end
  return nil, n > 0
end
