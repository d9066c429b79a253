-- force release: KEYS = lock, fence, queue, waiters, legacy fence, holds, their
-- expiries, done;
-- ARGV = nonce
-- Returns 1 if a lock was held, else 0.
--
-- Safe to run twice: a connection can break after Redis ran the script but
-- before the reply arrived, and the call is then sent again. A second run
-- would free the waiter the first one handed the lock to, and hand it to the
-- next: two holders. So the first run records its nonce and answer in
-- `done` for a minute, and a run with the same nonce only repeats the answer.
local lock, fence, queue, waiters, holds, expiries, done =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8]
local seen = redis.call('GET', done)
if seen then
  local nonce, answer = string.match(seen, '^(%S+) (%d)$')
  if nonce == ARGV[1] then
    return tonumber(answer)
  end
end
local held = redis.call('DEL', lock)

-- @helpers

-- Every shared hold or permit goes too.
local now = now_ms()
local n = prune(now)
if n > 0 then
  held = 1
end
redis.call('DEL', holds, expiries)
hand_off(now, nil)
redis.call('SET', done, ARGV[1] .. ' ' .. held, 'PX', 60000)
return held
