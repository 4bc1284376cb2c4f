-- ARGV: prefix, sid, nowIso ('' for the server's clock), checkLive '0'|'1', recorder
--   (audit.script_recorder's JSON with eventsMax = the event stream's cap), archiveTxn ('' or
--   the archive transition the delete is bound to)
-- Deletes the session and its whole subtree (every descendant not yet deleted, any depth):
-- each is marked deleted and dropped from every index and set the create path put it in (the
-- archived set, the listing indexes, its lineage, its own children sets), and the session
-- leaves its parent's children sets, so the parent no longer counts or walks it. With
-- checkLive the delete is refused when any of them has live work (the census's rule, has_live
-- in _lib.lua), so the check and the write are one step and no work is hidden by a delete.
-- The delete is audited here, so the record commits with it: the session's entry
-- ({"deletedCount": n}), and in the trail of each descendant it deleted the same entry id
-- (record_descendants in _lib.lua). A `deleted` event ({"type": "deleted", "sessionId"}) is
-- emitted for the session, then for each descendant it deleted (emit_event: the event stream
-- and the events channel), so the events commit with the delete.
-- With archiveTxn (a delete that archived the session first, then waited for its work to
-- end) nothing is deleted unless the session is still archived by that transition: if it
-- was unarchived meanwhile, what was created since belongs to whoever unarchived it.
-- Returns {'deleted', descendants (ids, breadth first)} | {'missing'} | {'active'} |
-- {'unarchived'}
local sid, now = ARGV[2], ARGV[3]
if now == '' then now = iso_ms(server_ms()) end
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'missing'}
end
local bound = ARGV[6] or ''
if bound ~= '' then
  local h = redis.call('HMGET', k, 'archived', 'archiveTxn')
  if h[1] ~= '1' or h[2] ~= bound then return {'unarchived'} end
end
local nodes = subtree(sid)
if ARGV[4] == '1' then
  for _, s in ipairs(nodes) do
    if has_live(s) then return {'active'} end
  end
end
local parent = redis.call('HGET', k, 'parentId')
if parent and parent ~= '' then
  redis.call('SREM', K.children(parent), sid)
  redis.call('SREM', K.busy_children(parent), sid)
end
for _, s in ipairs(nodes) do
  local h = redis.call('HMGET', skey(s), 'cwdHash')
  redis.call('HSET', skey(s), 'deleted', '1', 'deletedAt', now)
  redis.call('SREM', K.archived, s)
  for _, st in ipairs({'all', 'active', 'archived'}) do
    redis.call('ZREM', idx(st), s)
    redis.call('ZREM', idx(st, h[1]), s)
  end
  redis.call('DEL', K.lineage(s), K.children(s), K.busy_children(s))
end
local rec = cjson.decode(ARGV[5])
local id = record_in_script(rec, sid, 'deleted', now, detail_deleted(#nodes))
local below = {}
for i = 2, #nodes do below[#below + 1] = nodes[i] end
record_descendants(rec, id, sid, below, 'deleted', now)
for _, s in ipairs(nodes) do
  emit_event(event_deleted(s), rec.eventsMax or 10000)
end
return {'deleted', below}
