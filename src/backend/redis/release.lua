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
