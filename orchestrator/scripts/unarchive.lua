-- ARGV: prefix, sid, nowMs, nowIso
-- Restores the session and exactly the descendants its archive transition archived, and
-- stamps each restored session with unarchivedAt (nowIso, ISO 8601) / unarchivedMs (nowMs):
-- the auto-archive policy's idle clock is max(updatedAt, unarchivedAt), so a session an
-- operator unarchived by hand is not archived again until it has been idle that long since.
-- Every caller passes the time (Redis TIME, read through Store.now_ms).
-- Returns {'not_found'} | {'not_archived'} | {'ancestor', id} | {'unarchived', n, restored}:
-- restored lists the ids of the sessions it unarchived, the session first.
local sid = ARGV[2]
local now_ms, now_iso = tonumber(ARGV[3]), ARGV[4]
if not now_ms or not now_iso or now_iso == '' then
  return redis.error_reply('unarchive: nowMs and nowIso are required')
end
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
if redis.call('HGET', k, 'archived') ~= '1' then return {'not_archived'} end
for _, a in ipairs(redis.call('LRANGE', K.lineage(sid), 0, -1)) do
  if redis.call('SISMEMBER', K.archived, a) == 1 then return {'ancestor', a} end
end
local txn = redis.call('HGET', k, 'archiveTxn')
local n, restored = 0, {}
for _, s in ipairs(subtree(sid)) do
  local h = redis.call('HMGET', skey(s), 'archived', 'archiveTxn')
  if h[1] == '1' and h[2] == txn then
    redis.call('HSET', skey(s), 'archived', '0', 'archivedAt', '', 'archiveTxn', '',
      'unarchivedAt', now_iso, 'unarchivedMs', now_ms)
    redis.call('SREM', K.archived, s)
    move_index(s, 'archived', 'active')
    n = n + 1
    restored[n] = s
  end
end
return {'unarchived', n, restored}
