-- status: KEYS = lock, fence, queue, waiters, legacy fence, holds, their
-- expiries[, meta];
-- no ARGV.
-- Returns {} when free; held exclusively,
-- {owner, fence, acquired ms, remaining ms, now ms, queued waiters[, metadata]};
-- held shared or under permits, {0, kind, now ms, queued waiters, then per
-- live hold: owner, fence, acquired ms, remaining ms, metadata or ''}.
local lock = KEYS[1]
local current = redis.call('GET', lock)
if not current then
  local all = redis.call('HGETALL', KEYS[6])
  if #all == 0 then
    return {}
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local kind, meta, reply = nil, {}, {}
  for i = 1, #all, 2 do
    local field = all[i]
    if field == 'k' then
      kind = all[i + 1]
    elseif string.byte(field, 1) == 109 then
      meta[string.sub(field, 2)] = all[i + 1]
    end
  end
  for i = 1, #all, 2 do
    local field = all[i]
    -- A hold: its field is its fence ('a...' fields index them).
    local b = string.byte(field, 1)
    if b >= 48 and b <= 57 then
      local expiry, a, _, _, who = string.match(all[i + 1], '^(%d+) (%d+) (%S+) (%S+) (.+)$')
      if tonumber(expiry) > now then
        reply[#reply + 1] = who
        reply[#reply + 1] = field
        reply[#reply + 1] = a
        reply[#reply + 1] = tonumber(expiry) - now
        reply[#reply + 1] = meta[field] or ''
      end
    end
  end
  if #reply == 0 or not kind then
    return {}
  end
  local head = {0, kind, now, redis.call('HLEN', KEYS[4])}
  for i = 1, #reply do
    head[#head + 1] = reply[i]
  end
  return head
end
local f, a, holder = string.match(current, '^%d (%d+) (%d+) %S+ %S+ (.+)$')
if not holder then
  return redis.error_reply('tower-lock: unreadable lock value')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {holder, f, a, redis.call('PTTL', lock), now, redis.call('HLEN', KEYS[4])}
-- Metadata stored for this very acquisition (meta.lua), if any.
local meta = KEYS[8] and redis.call('GET', KEYS[8])
if meta and string.match(meta, '^(%d+) ') == f then
  reply[7] = string.sub(meta, #f + 2)
end
return reply
