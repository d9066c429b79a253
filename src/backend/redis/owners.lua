-- owner index (opt-in, RedisBackend::index_owners): KEYS = index of one
-- owner token, a hash of "<LockKey::encoded>" -> "<count> <until>": the
-- owner's acquisitions of that lock granted or under way (a count: two
-- acquisitions under one reused owner token never drop each other's
-- entry, whatever order their adds and drops arrive in), and the server
-- time (ms) until which one of them may still be waiting to be granted.
-- A hint only: its key is in the owner's cluster slot, not the lock's, so
-- it cannot be written in the lock's scripts; every lookup checks each
-- entry against the lock, and drops only those whose acquisitions had all
-- stopped waiting before the lookup read the index (a waiter, not holding
-- yet, is granted later). Entries of older versions hold a bare count.
-- ARGV = 'add', field, ttl ms, wait ms | 'drop', field | 'del', field,
-- listed ms | 'keep', ttl ms | 'list'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function read(field)
  local v = redis.call('HGET', KEYS[1], field)
  if not v then
    return 0, 0
  end
  local count, untl = string.match(v, '^(-?%d+) (%d+)$')
  if count then
    return tonumber(count), tonumber(untl)
  end
  return tonumber(v) or 0, 0
end
local function write(field, count, untl)
  redis.call('HSET', KEYS[1], field, string.format('%d %.0f', count, untl))
end
local op = ARGV[1]
if op == 'drop' then
  -- One acquisition fewer (released, or refused); the entry goes with the
  -- last.
  local count, untl = read(ARGV[2])
  if count <= 1 then
    redis.call('HDEL', KEYS[1], ARGV[2])
  else
    write(ARGV[2], count - 1, untl)
  end
  return 1
elseif op == 'add' or op == 'keep' then
  local ttl = tonumber(ARGV[op == 'add' and 3 or 2])
  if op == 'add' then
    local count, untl = read(ARGV[2])
    write(ARGV[2], count + 1, math.max(untl, now_ms() + tonumber(ARGV[4])))
  elseif redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
  end
  -- The index lives as long as the longest-lived lock it names could.
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 1
elseif op == 'del' then
  -- A lookup found the lock not held by the owner. An acquisition that
  -- may have been waiting when the lookup listed the index (or one added
  -- since) keeps the entry.
  local _, untl = read(ARGV[2])
  if untl >= tonumber(ARGV[3]) then
    return 0
  end
  return redis.call('HDEL', KEYS[1], ARGV[2])
end
local reply = redis.call('HKEYS', KEYS[1])
table.insert(reply, 1, now_ms())
return reply
