-- tower-lock: helpers for the slow paths, spliced into a script at its
-- `-- @helpers` line (after its fast path, so the fast path never pays for
-- creating these closures). The script has declared `lock`, `fence`,
-- `queue`, `waiters` (KEYS[1..4]); KEYS[5] is the lock's legacy fence
-- counter. See mod.rs for the layout.

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

-- Hand the (free) lock to the oldest waiter whose own deadline has not
-- passed, skipping dead entries. Waiters are queued by ticket
-- ("<waiter id>@<channel>"); the new holder is told through its instance's
-- channel ("<waiter id> <fence> <acquired ms>"), unless its ticket is `me`,
-- the caller of this very script. Returns fence, ticket or nil.
local function hand_off(now, me)
  while true do
    local ticket = redis.call('LPOP', queue)
    if not ticket then
      return nil
    end
    local data = redis.call('HGET', waiters, ticket)
    if data then
      redis.call('HDEL', waiters, ticket)
      now = now or now_ms()
      local deadline, ttl, attempt, who = string.match(data, '^(%d+) (%d+) (%S+) (.+)$')
      if deadline and tonumber(deadline) > now then
        local f = take(who, attempt, ttl, now, '1', ticket)
        if ticket ~= me then
          local id, chan = string.match(ticket, '^(%d+)@(.+)$')
          -- A channel with a hash tag is a cluster's shard channel, in this
          -- lock's slot: sharded pub/sub reaches its subscriber on this
          -- shard without crossing the cluster bus.
          local publish = 'PUBLISH'
          if string.find(chan, '{', 1, true) then
            publish = 'SPUBLISH'
          end
          redis.call(publish, chan, string.format('%s %d %d', id, f, now))
        end
        return f, ticket
      end
    end
  end
end
