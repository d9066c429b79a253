-- flight publish: KEYS = the flight's lock, fence, queue, waiters, legacy
-- fence, holds, their expiries, result, fresh, watchers (as flight_begin).
-- ARGV = owner, fence (the leader's), value, result TTL ms (0: none), keep
-- ms (used only while callers wait: watchers, or queued for the lock; with
-- nobody waiting the result is kept for its result TTL alone, and not
-- stored at all without one).
-- Returns 1 (stored unless a newer result is, watchers told, lock released
-- or handed on; also for a repeated run of a publish that did all that), 0
-- (not held: expired), -1 (held by another owner or under another fence).

local lock, fence, queue, waiters, holds, expiries = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7]
local result, fresh, watchers = KEYS[8], KEYS[9], KEYS[10]
local owner, seq, value = ARGV[1], ARGV[2], ARGV[3]

local current = redis.call('GET', lock)
local _, f, holder
if current then
  _, f, _, _, _, holder = string.match(current, '^(%d) (%d+) (%d+) (%S+) (%S+) (.+)$')
end
if not current or holder ~= owner or f ~= seq then
  -- Not (or no longer) the leader's lock. A run repeated after a lost reply
  -- (see Pinned::eval) finds it released by its own first run: the result
  -- stored under the leader's fence, which no one else can store, says
  -- that run succeeded.
  if redis.call('HGET', result, 'seq') == seq then
    return 1
  end
  if not current then
    return 0
  end
  return -1
end

-- @helpers

local keep = ARGV[5]
if redis.call('EXISTS', watchers, queue) == 0 then
  keep = ARGV[4]
end

local stored = tonumber(redis.call('HGET', result, 'seq') or '0')
if tonumber(seq) > stored and keep == '0' then
  -- Nobody waits for it, and it answers nobody new.
  redis.call('DEL', result, fresh)
elseif tonumber(seq) > stored then
  redis.call('HSET', result, 'seq', seq, 'value', value)
  redis.call('PEXPIRE', result, keep)
  if ARGV[4] ~= '0' then
    redis.call('PSETEX', fresh, ARGV[4], seq)
  else
    redis.call('DEL', fresh)
  end
  -- Every watcher, one message per channel: "f <seq> <id>,<id>…\n<value>".
  local by_channel = {}
  for _, ticket in ipairs(redis.call('SMEMBERS', watchers)) do
    local id, chan = string.match(ticket, '^(%d+)@(.+)$')
    if id then
      local ids = by_channel[chan]
      if not ids then
        ids = {}
        by_channel[chan] = ids
      end
      ids[#ids + 1] = id
    end
  end
  for chan, ids in pairs(by_channel) do
    -- A channel with a hash tag is a cluster's shard channel, in this
    -- flight's slot (see hand_off).
    local publish = 'PUBLISH'
    if string.find(chan, '{', 1, true) then
      publish = 'SPUBLISH'
    end
    redis.call(publish, chan, 'f ' .. seq .. ' ' .. table.concat(ids, ',') .. '\n' .. value)
  end
  redis.call('DEL', watchers)
end

-- Released as release.lua does: the next live waiter gets the lock (it then
-- reads the result stored above), else it goes.
redis.call('DEL', lock)
hand_off(nil, nil)
return 1
