-- owner index (opt-in, RedisBackend::index_owners): KEYS = index of one
-- owner token, a hash of "<LockKey::encoded>" -> the owner's acquisitions of
-- that lock granted or under way (a count: two acquisitions under one reused
-- owner token never drop each other's entry, whatever order their adds and
-- drops arrive in). A hint only: its key is in the owner's cluster slot, not
-- the lock's, so it cannot be written in the lock's scripts; every lookup
-- checks each entry against the lock.
-- ARGV = 'add', field, ttl ms | 'drop', field | 'del', field | 'keep', ttl
-- ms | 'list'
local op = ARGV[1]
if op == 'drop' then
  -- One acquisition fewer (released, or refused); the entry goes with the
  -- last.
  if redis.call('HINCRBY', KEYS[1], ARGV[2], -1) <= 0 then
    redis.call('HDEL', KEYS[1], ARGV[2])
  end
  return 1
elseif op == 'add' or op == 'keep' then
  local ttl = tonumber(ARGV[op == 'add' and 3 or 2])
  if op == 'add' then
    redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  elseif redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
  end
  -- The index lives as long as the longest-lived lock it names could.
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 1
elseif op == 'del' then
  -- A lookup found the lock not held by the owner.
  return redis.call('HDEL', KEYS[1], ARGV[2])
end
return redis.call('HKEYS', KEYS[1])
