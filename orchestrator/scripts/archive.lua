-- ARGV: prefix, sid, stopActivity '0'|'1', nowIso ('' for the server's clock), txn, recorder
--   (audit.script_recorder's JSON with metric = the fleet_archives key, eventsMax = the
--   event stream's cap and cancelledBy = what its stopped turns record), confirmed ('' or a JSON array of 'family:id' strings: the live items
--   the user confirmed stopping)
-- Checks for live work (unless stopActivity) and writes the archive for the session and its
-- whole subtree in one step, so no work can start unseen between the check and the write.
-- With stopActivity the live turns of every session it archives are stopped in this same
-- script (stop_turns_for_archive in _lib.lua).
-- With stopActivity and confirmed, the archive is refused ({'changed'}, nothing written) when
-- an item is live now that was not confirmed, named as the census names it: turn:, job:,
-- reminder: ids of the session itself, subagent:<descendant id> for a descendant with live
-- work of its own (orchestrator/activity.py).
-- Returns {'not_found'} | {'already', archiveTxn (of the archive in place), census} |
-- {'active'} | {'changed'} | {'archived', n, turns, archived, census, nowIso}: turns is a
-- flat list tid, sid, fromState, toState, label,
-- settlement (of an open tool call, JSON or '') of the turns it stopped; archived a flat list
-- sid, historyLength of every session it archived, the session first (its history's length
-- once its turns were stopped: what the session's clients are sent before it closes);
-- census (with stopActivity, else empty) a flat list sid, census_rows(sid) for the session
-- and every descendant (descendants in _lib.lua), read after the turns were stopped, in the
-- same atomic step as the write: the census after the archive, with no round trip of its own.
-- 'already' carries the census too (with stopActivity), read in the same step as the archive
-- it found: what its stops name is only what lived under that archive, never work created
-- after an unarchive that comes between this script and the stops' arrival.
-- The events of the transition (orchestrator/events.py) are emitted here, in order: one
-- 'archived' per archived session, then per stopped turn its tool-call settlement ('update')
-- and, for a turn that ended, its 'turn' event. An archive and a repeat are audited and
-- counted here, so the record commits with the change (a refusal is recorded by the caller,
-- which reads the live items after this script); each descendant it archived gets the
-- archive's entry in its own trail (record_descendants in _lib.lua).
local sid, stop, now, txn = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if now == '' then now = iso_ms(server_ms()) end
local rec = cjson.decode(ARGV[6])
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
-- With stopActivity, the census of the session and every descendant (subtree_census in
-- _lib.lua); else empty.
local function census_of_subtree()
  if stop == '1' then return subtree_census(sid) end
  return {}
end
if redis.call('HGET', k, 'archived') == '1' then
  record_in_script(rec, sid, 'already_archived', now, detail_already_archived(stop == '1'))
  redis.call('HINCRBY', rec.metric, 'already_archived', 1)
  return {'already', redis.call('HGET', k, 'archiveTxn') or '', census_of_subtree()}
end
local nodes = subtree(sid)
if stop ~= '1' then
  for _, s in ipairs(nodes) do
    if has_live(s) then return {'active'} end
  end
elseif ARGV[7] ~= '' then
  local confirmed = {}
  for _, item in ipairs(cjson.decode(ARGV[7])) do confirmed[item] = true end
  for _, item in ipairs(live_items(sid)) do
    if not confirmed[item] then return {'changed'} end
  end
  for i = 2, #nodes do
    if has_live(nodes[i]) and not confirmed['subagent:' .. nodes[i]] then return {'changed'} end
  end
end
local n, turns, archived = 0, {}, {}
for _, s in ipairs(nodes) do
  if redis.call('HGET', skey(s), 'archived') ~= '1' then
    redis.call('HSET', skey(s), 'archived', '1', 'archivedAt', now, 'archiveTxn', txn)
    redis.call('SADD', K.archived, s)
    move_index(s, 'active', 'archived')
    if stop == '1' then stop_turns_for_archive(s, turns, rec.cancelledBy) end
    n = n + 1
    archived[#archived + 1] = s
    archived[#archived + 1] = redis.call('LLEN', K.history(s))
  end
end
local id = record_in_script(rec, sid, 'archived', now,
  detail_archived(n, stop == '1', #turns / 6))
-- Each descendant archived here (every second item of archived after the session's pair).
local below = {}
for i = 3, #archived, 2 do below[#below + 1] = archived[i] end
record_descendants(rec, id, sid, below, 'archived', now)
redis.call('HINCRBY', rec.metric, 'archived', 1)
-- The events, as events.publish_many writes them.
emit_archive_events(archived, turns, rec.eventsMax or 10000)
return {'archived', n, turns, archived, census_of_subtree(), now}
