-- ARGV: prefix, sid, nowMs, nowIso ('' for both: the server's clock), recorder
--   (audit.script_recorder's JSON)
-- Restores the session and exactly the descendants its archive transition archived, and
-- stamps each restored session with unarchivedAt (nowIso, ISO 8601) / unarchivedMs (nowMs):
-- the auto-archive policy's idle clock is max(updatedAt, unarchivedAt), so a session an
-- operator unarchived by hand is not archived again until it has been idle that long since.
-- Every outcome but not_found is audited here, at nowIso, so its entry commits with what the
-- script saw and an entry's time sorts as its id does (the server's clock, read here): the
-- session's entry ({"restoredCount": n}), and in the trail of each descendant it restored the
-- same entry id (record_descendants in _lib.lua); a no-op ('not_archived', {}) and a refusal
-- ('refused', {"archivedAncestor": id}), so no concurrent archive's entry can come between
-- what this script found and its record.
-- Returns {'not_found'} | {'not_archived'} | {'ancestor', id} | {'unarchived', n, restored}:
-- restored lists the ids of the sessions it unarchived, the session first.
local sid = ARGV[2]
local now_ms, now_iso = tonumber(ARGV[3]), ARGV[4]
if ARGV[3] == '' and now_iso == '' then
  now_ms = server_ms()
  now_iso = iso_ms(now_ms)
elseif not now_ms or not now_iso or now_iso == '' then
  return redis.error_reply('unarchive: nowMs and nowIso are both given or both empty')
end
if not ARGV[5] or ARGV[5] == '' then
  return redis.error_reply('unarchive: the recorder is required')
end
local rec = cjson.decode(ARGV[5])
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
if redis.call('HGET', k, 'archived') ~= '1' then
  record_in_script(rec, sid, 'not_archived', now_iso, '{}')
  return {'not_archived'}
end
-- Refused under an archived ancestor, naming the farthest one: the archived set is
-- materialized down the lineage, so the ancestors between it and sid are archived too and
-- their unarchive would be refused the same way; only its unarchive can be asked.
local topmost = false
for _, a in ipairs(redis.call('LRANGE', K.lineage(sid), 0, -1)) do
  if redis.call('SISMEMBER', K.archived, a) == 1 then topmost = a end
end
if topmost then
  record_in_script(rec, sid, 'refused', now_iso, detail_refused_ancestor(topmost))
  return {'ancestor', topmost}
end
local txn = redis.call('HGET', k, 'archiveTxn')
local n, restored, below = 0, {}, {}
for _, s in ipairs(subtree(sid)) do
  local h = redis.call('HMGET', skey(s), 'archived', 'archiveTxn')
  if h[1] == '1' and h[2] == txn then
    redis.call('HSET', skey(s), 'archived', '0', 'archivedAt', '', 'archiveTxn', '',
      'unarchivedAt', now_iso, 'unarchivedMs', now_ms)
    redis.call('SREM', K.archived, s)
    move_index(s, 'archived', 'active')
    n = n + 1
    restored[n] = s
    if n > 1 then below[n - 1] = s end
  end
end
local id = record_in_script(rec, sid, 'unarchived', now_iso, detail_unarchived(n))
record_descendants(rec, id, sid, below, 'unarchived', now_iso)
return {'unarchived', n, restored}
