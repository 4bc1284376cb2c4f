-- ARGV: prefix, sid[, nowMs]
-- Restores the session and exactly the descendants its archive transition archived, and
-- stamps each restored session with unarchivedAt (ISO 8601) / unarchivedMs: the auto-archive
-- policy's idle clock is max(updatedAt, unarchivedAt), so a session an operator unarchived by
-- hand is not archived again until it has been idle that long since. Without nowMs the
-- server's clock is used (TIME; scripts replicate their effects).
-- Returns {'not_found'} | {'not_archived'} | {'ancestor', id} | {'unarchived', n}
local sid = ARGV[2]
local now_ms = tonumber(ARGV[3])
if not now_ms then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Epoch milliseconds as ISO 8601 UTC (days-to-civil, proleptic Gregorian calendar).
local function iso_ms(ms)
  local days = math.floor(ms / 86400000)
  local rem = ms - days * 86400000
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d,
    math.floor(rem / 3600000), math.floor(rem / 60000) % 60, math.floor(rem / 1000) % 60,
    rem % 1000)
end
local now_iso = iso_ms(now_ms)
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
if redis.call('HGET', k, 'archived') ~= '1' then return {'not_archived'} end
for _, a in ipairs(redis.call('LRANGE', P .. 'lineage:' .. sid, 0, -1)) do
  if redis.call('SISMEMBER', P .. 'archived', a) == 1 then return {'ancestor', a} end
end
local txn = redis.call('HGET', k, 'archiveTxn')
local n = 0
for _, s in ipairs(subtree(sid)) do
  local h = redis.call('HMGET', skey(s), 'archived', 'archiveTxn')
  if h[1] == '1' and h[2] == txn then
    redis.call('HSET', skey(s), 'archived', '0', 'archivedAt', '', 'archiveTxn', '',
      'unarchivedAt', now_iso, 'unarchivedMs', now_ms)
    redis.call('SREM', P .. 'archived', s)
    move_index(s, 'archived', 'active')
    n = n + 1
  end
end
return {'unarchived', n}
