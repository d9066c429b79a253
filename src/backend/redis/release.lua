-- release: KEYS = lock, fence, queue, waiters, legacy fence, holds; ARGV =
-- owner, fence of the acquisition ('' = whichever the owner holds)
-- Returns 1 (released), 0 (not held), -1 (held by another acquisition:
-- another owner, or this owner under another fence).

local current = redis.call('GET', KEYS[1])
if current then
  -- The holder is everything after the value's last space. Owners have no
  -- spaces (the caller sends an owner with a space as ' ', which matches
  -- nobody), so "ends with ' ' .. owner" is "held by owner". Cheaper than a
  -- pattern match, as are `KEYS[1]` without a local and the flag's byte.
  local owner = ARGV[1]
  local n = #owner
  if string.sub(current, -n) ~= owner or string.byte(current, -n - 1) ~= 32 then
    return -1
  end
  -- The value starts "<flag> <fence> ": the fence sits from byte 3 to the
  -- next space. A reused custom owner's older acquisition names another.
  local f = ARGV[2]
  if f ~= '' and (string.sub(current, 3, #f + 2) ~= f or string.byte(current, #f + 3) ~= 32) then
    return -1
  end
  if string.byte(current, 1) == 48 then
    -- Flag '0', nobody queued: the fast path.
    redis.call('DEL', KEYS[1])
    return 1
  end
end

if not current and ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 0 then
  -- A shared hold or a permit named by its fence, nobody queued: nothing
  -- to hand on, so no helpers. Its own hold, live: dropped as `drop_hold`
  -- (common.lua) drops it, or with the last hold both keys. Holds that
  -- ran out meanwhile stay for the next acquire's prune (nobody waits for
  -- them). Anything else: the slow path below answers.
  local f = ARGV[2]
  local value = redis.call('HGET', KEYS[6], f)
  if value then
    local expiry, _, attempt, _, who = string.match(value, '^(%d+) (%d+) (%S+) (%S+) (.+)$')
    local t = redis.call('TIME')
    if who == ARGV[1]
      and tonumber(expiry) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
      local expiries = KEYS[6] .. 'e'
      if redis.call('ZCARD', expiries) <= 1 then
        -- The last hold (its expiry the index's one entry): both keys go.
        redis.call('DEL', KEYS[6], expiries)
        return 1
      end
      local index = 'a' .. attempt .. ' ' .. who
      if redis.call('HGET', KEYS[6], index) == f then
        redis.call('HDEL', KEYS[6], f, 'm' .. f, index)
      else
        redis.call('HDEL', KEYS[6], f, 'm' .. f)
      end
      redis.call('ZREM', expiries, f)
      return 1
    end
  end
end

local lock, fence, queue, waiters, holds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
-- The holds' expiry index, named beside the holds (same hash tag, same
-- slot) rather than sent: the exclusive fast path above never needs it,
-- and every key sent costs each release server time (keys.rs).
local expiries = holds .. 'e'

-- @helpers

if current then
  -- Ours with waiters queued: the next live waiters get it now.
  redis.call('DEL', lock)
  hand_off(nil, nil)
  return 1
end
-- No exclusive holder: one of the shared holds or permits, if any; then
-- whatever is free goes to the queue (also when every hold ran out).
local now = now_ms()
local found, value = hold_of(ARGV[1], ARGV[2], now)
if found then
  drop_hold(found, value)
end
local n = prune(now)
hand_off(now, nil, n)
if found then
  return 1
elseif n > 0 then
  return -1
end
return 0
