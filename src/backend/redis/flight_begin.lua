-- flight begin: KEYS = the flight's lock, fence, queue, waiters, legacy
-- fence, holds, their expiries (as acquire), result (hash: seq, value),
-- fresh (string: seq, TTL = the result TTL), watchers (set of tickets).
-- ARGV = ttl ms, "<caller's clock ms> - <attempt> <owner>", '0' (the
-- acquire part never queues), watcher id, channel, keep ms (how long the
-- watchers set must last: the max wait).
-- Returns {2, seq, value} for a fresh result (nothing taken), what acquire
-- returns when the lock was taken (the fence, or {1, fence, acquired ms,
-- now ms}), else {0, holder's remaining ms, seq of the newest stored result
-- or 0}, with the caller's ticket added to the watchers.

if redis.call('EXISTS', KEYS[9]) == 1 then
  local r = redis.call('HMGET', KEYS[8], 'seq', 'value')
  if r[1] then
    return {2, r[1], r[2]}
  end
end

local function acquire()
-- @acquire
end

local got = acquire()
if type(got) == 'number' or got[1] == 1 then
  return got
end
local watchers = KEYS[10]
redis.call('SADD', watchers, ARGV[4] .. '@' .. ARGV[5])
if redis.call('PTTL', watchers) < tonumber(ARGV[6]) then
  redis.call('PEXPIRE', watchers, ARGV[6])
end
return {0, got[2], redis.call('HGET', KEYS[8], 'seq') or 0}
