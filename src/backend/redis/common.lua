-- tower-lock: helpers for the slow paths, spliced into a script at its
-- `-- @helpers` line (after its fast path, so the fast path never pays for
-- creating these closures). The script has declared `lock`, `fence`,
-- `queue`, `waiters` (KEYS[1..4]); see mod.rs for the layout.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- flag, fence, acquired ms, grant, owner
local function parse(value)
  return string.match(value, '^(%d) (%d+) (%d+) (%S+) (.+)$')
end

-- Make `owner` the holder for `ttl` ms with a fresh fencing token.
local function take(owner, ttl, now, flag, grant)
  local f = redis.call('INCR', fence)
  redis.call('SET', lock, string.format('%s %d %d %s %s', flag, f, now, grant, owner), 'PX', ttl)
  return f
end

-- Hand the (free) lock to the oldest waiter whose own deadline has not
-- passed, skipping dead entries. The new holder is told through its
-- instance's channel ("<waiter id> <fence> <acquired ms>"), unless it is
-- `me`, the caller of this very script. Returns fence, owner or nil.
local function hand_off(now, me)
  while true do
    local who = redis.call('LPOP', queue)
    if not who then
      return nil
    end
    local data = redis.call('HGET', waiters, who)
    if data then
      redis.call('HDEL', waiters, who)
      now = now or now_ms()
      local deadline, ttl, grant = string.match(data, '^(%d+) (%d+) (%S+)$')
      if deadline and tonumber(deadline) > now then
        local f = take(who, ttl, now, '1', grant)
        if who ~= me then
          local id, chan = string.match(grant, '^(%d+)@(.+)$')
          redis.call('PUBLISH', chan, string.format('%s %d %d', id, f, now))
        end
        return f, who
      end
    end
  end
end
