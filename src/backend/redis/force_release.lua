-- force release: KEYS = lock, fence, queue, waiters; no ARGV.
-- Returns 1 if a lock was held, else 0.
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held = redis.call('DEL', lock)

-- @helpers

hand_off(nil, nil)
return held
