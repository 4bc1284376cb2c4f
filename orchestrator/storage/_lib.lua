-- Shared helpers, prepended to every script by orchestrator.storage.store, after the prelude
-- orchestrator/storage/keys.py generates: `K` holds every key builder (K.turn(tid), K.archived), `P`
-- is the key prefix (ARGV[1]). No script spells a key name itself.

local function skey(sid) return K.session(sid) end

-- A client's idempotency key (orchestrator/storage/idempotency.py) as a creating script reads it:
-- digest '' (no key) or one not seen: nil; seen with the same request fingerprint fp:
-- {'replay', id} (the id the first request created); with another: {'key_reused'}.
local function idem_seen(scope, digest, fp)
  if digest == '' then return nil end
  local h = redis.call('HMGET', K.idempotency(scope, digest), 'fp', 'id')
  if not h[2] then return nil end
  if h[1] ~= fp then return {'key_reused'} end
  return {'replay', h[2]}
end

-- Records the key with what its request created, in the script that created it.
local function idem_record(scope, digest, fp, id, ttl_ms)
  if digest == '' then return end
  local k = K.idempotency(scope, digest)
  redis.call('HSET', k, 'fp', fp, 'id', id)
  redis.call('PEXPIRE', k, ttl_ms)
end

-- The members of a set, sorted (the order the census lists them in).
local function sorted_members(key)
  local members = redis.call('SMEMBERS', key)
  table.sort(members)
  return members
end

-- The server's clock in epoch milliseconds (scripts replicate their effects, so TIME is safe).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- ISO 8601 UTC as iso_ms writes it (milliseconds optional) in epoch milliseconds
-- (civil-to-days, proleptic Gregorian calendar); nil for anything else.
local function ms_of_iso(text)
  local y, mo, d, h, mi, se, frac = string.match(text or '',
    '^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)%.?(%d*)Z$')
  if not y then return nil end
  y, mo = tonumber(y), tonumber(mo)
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((mo + 9) % 12) + 2) / 5) + tonumber(d) - 1
  local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    - 719468
  local ms = tonumber(string.sub(frac .. '000', 1, 3))
  return (((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60 + tonumber(se)) * 1000 + ms
end

-- The step gate's rule (orchestrator/session/gate.py), the one place it is written: why no model step
-- of sid may run, or false. The archived set is materialized down the lineage, so the
-- session's own membership covers its ancestors. Returns false | 'missing' | 'deleted' |
-- 'archived'. deleted: the session's 'deleted' field when the caller read it already.
local function gate_refusal(sid, deleted)
  if deleted == nil then deleted = redis.call('HGET', skey(sid), 'deleted') end
  if not deleted then return 'missing' end
  if deleted ~= '0' then return 'deleted' end
  if redis.call('SISMEMBER', K.archived, sid) == 1 then return 'archived' end
  return false
end

local function idx(state, cwd_hash) return K.index(state, cwd_hash) end

-- Move a session between the listing indexes of two states, keeping its score.
local function move_index(sid, from, to)
  local h = redis.call('HMGET', skey(sid), 'cwdHash', 'updatedMs')
  local score = tonumber(h[2]) or 0
  redis.call('ZREM', idx(from), sid)
  redis.call('ZREM', idx(from, h[1]), sid)
  redis.call('ZADD', idx(to), score, sid)
  redis.call('ZADD', idx(to, h[1]), score, sid)
end

-- Whether a step of turn tid may still write (every write a step makes is conditional on its
-- turn running, so a stopped or archived turn's step lands nothing). '' guards nothing.
local function turn_runs(tid)
  if not tid or tid == '' then return true end
  return redis.call('HGET', K.turn(tid), 'state') == TURN.RUNNING
end

-- The fencing rule of a step (orchestrator/session/fencing.py): whether the copy of tid's current
-- step that began with token still owns it. The lease (Keys.step_lease) holds the token of
-- the copy that began last; that copy owns the step. A lease that lapsed (its worker froze)
-- is re-taken here, atomically with the caller's write, only if no other copy began since
-- (the turn's stepToken is still token; turn_advance clears it): a copy that begins later
-- then finds the lease and is dropped as 'inflight'. Once another copy began, the old one
-- owns nothing, ever.
local function holds_step(tid, token)
  local lk = K.step_lease(tid)
  local lease = redis.call('GET', lk)
  if lease then return lease == token end
  local h = redis.call('HMGET', K.turn(tid), 'stepToken', 'stepLeaseMs')
  if not h[1] or h[1] ~= token then return false end
  redis.call('SET', lk, token, 'PX', tonumber(h[2]) or 5000)
  return true
end

-- The guard of every write a step makes: its turn still runs and the copy still owns the
-- step (holds_step). '' guards nothing (a write no step makes).
local function step_owns(tid, token)
  if not tid or tid == '' then return true end
  return turn_runs(tid) and holds_step(tid, token or '')
end

-- What a step in flight polls (turn_watch.lua, one per call of turn_watch_many.lua): the
-- turn's state, or 'superseded' when the copy of its step that began with token no longer
-- owns it while the turn is live; with lease_ms that copy's lease is refreshed (holds_step
-- re-takes a lapsed one if no other copy began). Returns the state | 'superseded' |
-- 'missing'.
local function watch_step(tid, lease_ms, token)
  local st = redis.call('HGET', K.turn(tid), 'state') or 'missing'
  if st ~= TURN.RUNNING and st ~= TURN.CANCELLING then return st end
  if not holds_step(tid, token) then return 'superseded' end
  if lease_ms then redis.call('PEXPIRE', K.step_lease(tid), lease_ms) end
  return st
end

-- A session's updatedAt is its last activity to within this many ms: a turn's end closer
-- than that to the last touch does not touch it again (finish_turn).
local TOUCH_QUIET_MS = 1000

-- Record activity on a session: updatedAt moves and the indexes are re-scored. An archived
-- session keeps the updatedAt its archive left (nothing that happens after it is activity).
-- h: the session's {cwdHash, archived, deleted} when the caller read them already.
local function touch(sid, ms, iso_time, h)
  local k = skey(sid)
  h = h or redis.call('HMGET', k, 'cwdHash', 'archived', 'deleted')
  if h[3] ~= '0' or h[2] == '1' then return end
  redis.call('HSET', k, 'updatedAt', iso_time, 'updatedMs', ms)
  redis.call('ZADD', idx('all'), ms, sid)
  redis.call('ZADD', idx('active'), ms, sid)
  redis.call('ZADD', idx('all', h[1]), ms, sid)
  redis.call('ZADD', idx('active', h[1]), ms, sid)
end

-- The one walk of a session's subtree: sid, then its descendants, breadth first, each
-- session's children as children_of(s) lists them (default: its children set as SMEMBERS
-- answers; sorted_members for the census's order). keep(s) says whether s is listed (default:
-- every one); one left out is still walked through, its descendants listed by the same rule.
-- With no_root, sid itself is not listed.
local function walk(sid, keep, children_of, no_root)
  local out, queue, i = {}, {sid}, 1
  while queue[i] do
    local s = queue[i]
    if (i > 1 or not no_root) and (not keep or keep(s)) then out[#out + 1] = s end
    i = i + 1
    local kids = children_of and children_of(s) or redis.call('SMEMBERS', K.children(s))
    for _, c in ipairs(kids) do queue[#queue + 1] = c end
  end
  return out
end

local function not_deleted(s) return redis.call('HGET', skey(s), 'deleted') == '0' end

-- The session and every descendant that is not deleted, breadth first (a deleted session is
-- left out, but its descendants are still walked).
local function subtree(sid) return walk(sid, not_deleted) end

-- Marks quiet, for archive transition txn, every session of nodes archived in that same
-- transition and not yet marked (a session archived again later has a new transition).
local function mark_transition_quiet(nodes, txn, now)
  for _, s in ipairs(nodes) do
    local d = redis.call('HMGET', skey(s), 'archived', 'archiveTxn', 'quietTxn')
    if d[1] == '1' and d[2] == txn and d[3] ~= txn then
      redis.call('HSET', skey(s), 'quietAt', now, 'quietTxn', txn)
    end
  end
end

-- '1' when a session whose parent is parent was the one its transition txn was asked for
-- (its parent is not in the transition), else '0'.
local function transition_root(parent, txn)
  if parent and parent ~= '' and redis.call('HGET', skey(parent), 'archiveTxn') == txn then
    return '0'
  end
  return '1'
end

-- Nearest archived session among sid and its ancestors, or false. root: the caller knows
-- sid has no parent (its lineage is empty and is not read).
local function archived_in_lineage(sid, root)
  if redis.call('SISMEMBER', K.archived, sid) == 1 then return sid end
  if root then return false end
  for _, a in ipairs(redis.call('LRANGE', K.lineage(sid), 0, -1)) do
    if redis.call('SISMEMBER', K.archived, a) == 1 then return a end
  end
  return false
end

-- The activity families whose items a session owns, in registry order
-- (orchestrator/families). Each registers its liveness rule here, the one place it is written,
-- from its own Lua (put after this library by orchestrator.storage.store):
--   family(name, {ids = function(sid) -> item ids, verdict = function(id) -> 'live' | 'stale'
--     | false, hash = function(id) -> key, fields = {hash fields the census labels with},
--     key = function(sid) -> the one key ids reads (optional)})
-- 'stale': the item's owner vanished (a lease lapsed); it does not count, and the census
-- settles it. A family that names its key lets a session with no item of any such family be
-- known idle from one EXISTS (item_keys, has_live) instead of a read per family; a family
-- without one is always read through its ids.
local FAMILIES = {}
local function family(name, spec)
  spec.name = name
  FAMILIES[#FAMILIES + 1] = spec
end

-- The keys of the session's own items of every family that names one, appended to out.
local function item_keys(sid, out)
  out = out or {}
  for _, f in ipairs(FAMILIES) do
    if f.key then out[#out + 1] = f.key(sid) end
  end
  return out
end

-- Whether the session itself has live work (its own items of any family). bare says what
-- the caller already knows of item_keys(sid): true, none exists (those families are not
-- read); false, some exists (read them all); nil, nothing (one EXISTS tells first).
local function has_live(sid, bare)
  if bare == nil then
    local keys = item_keys(sid)
    bare = #keys > 0 and redis.call('EXISTS', unpack(keys)) == 0
  end
  for _, f in ipairs(FAMILIES) do
    if not (bare and f.key) then
      for _, id in ipairs(f.ids(sid)) do
        if f.verdict(id) == 'live' then return true end
      end
    end
  end
  return false
end

-- Whether the session holds any item of any family, live or stale (has_live judges them):
-- a key a family names exists, or a family without one lists an id.
local function holds_items(sid)
  local keys = item_keys(sid)
  if #keys > 0 and redis.call('EXISTS', unpack(keys)) > 0 then return true end
  for _, f in ipairs(FAMILIES) do
    if not f.key and #f.ids(sid) > 0 then return true end
  end
  return false
end

-- Puts sid in its parent's busy_children, or takes it out, by whether it is not deleted and
-- holds items. Every script that adds or removes an item of a session calls it after the
-- change (create_session.lua counts live subagents among the parent's busy ones only).
-- h: the session's {parentId, deleted} when the caller read them already.
local function sync_busy(sid, h)
  h = h or redis.call('HMGET', skey(sid), 'parentId', 'deleted')
  if not h[1] or h[1] == '' then return end
  if h[2] == '0' and holds_items(sid) then
    redis.call('SADD', K.busy_children(h[1]), sid)
  else
    redis.call('SREM', K.busy_children(h[1]), sid)
  end
end

-- The session's own live items as 'family:id' strings (what census.lua reports).
local function live_items(sid)
  local out = {}
  for _, f in ipairs(FAMILIES) do
    for _, id in ipairs(f.ids(sid)) do
      if f.verdict(id) == 'live' then out[#out + 1] = f.name .. ':' .. id end
    end
  end
  return out
end

-- The census of one session's own items by each family's liveness rule: per family in
-- registry order {name, {{id, field...}, ...} (live items with the family's label fields),
-- {stale id, ...}} (census.lua's reply for one session; orchestrator/census/activity.py reads it).
local function census_rows(sid)
  local per = {}
  for _, f in ipairs(FAMILIES) do
    local live, stale = {}, {}
    for _, id in ipairs(f.ids(sid)) do
      local verdict = f.verdict(id)
      if verdict == 'stale' then
        stale[#stale + 1] = id
      elseif verdict then
        local row = {id}
        if #f.fields > 0 then
          for _, v in ipairs(redis.call('HMGET', f.hash(id), unpack(f.fields))) do
            row[#row + 1] = v
          end
        end
        live[#live + 1] = row
      end
    end
    per[#per + 1] = {f.name, live, stale}
  end
  return per
end

-- Every descendant of sid, any depth, deleted ones included, breadth first with each
-- session's children in sorted order (the order the census lists subagents in).
local function descendants(sid)
  return walk(sid, nil, function(s) return sorted_members(K.children(s)) end, true)
end

-- The census of sid and every descendant (census_rows, in the order descendants walks them)
-- as a flat list sid, rows, ...: what an archive's stops name, read in the step that writes
-- or finds the archive (orchestrator/census/activity.py census_of_rows reads it).
local function subtree_census(sid)
  local out = {sid, census_rows(sid)}
  for _, d in ipairs(descendants(sid)) do
    out[#out + 1] = d
    out[#out + 1] = census_rows(d)
  end
  return out
end

-- Publish a lifecycle event from the script that makes the change (orchestrator/storage/events.py:
-- appended to the capped event stream, then published on the events channel), so it
-- commits with the change and costs no round trip of its own. payload is the event's JSON.
local function emit_event(payload, stream_max)
  redis.call('XADD', K.event_stream, 'MAXLEN', '~', stream_max, '*', 'event', payload)
  redis.call('PUBLISH', K.events, payload)
end

-- Publish a conversation update of session sid (its JSON) as events.publish_many writes it
-- (an update event is only published: the history list is its durable record).
local function publish_update(sid, update_json)
  redis.call('PUBLISH', K.events, event_update(sid, update_json))
end

-- An archive's events, as events.publish_many writes them (json.dumps of {type, sessionId,
-- ...}): `archived` holds (sessionId, historyLength) pairs, one per session archived, the
-- session first; `turns` holds the stopped turns as stop_turns_for_archive lists them, six
-- fields each (turn id, session id, previous state, new state, label, settlement): a settled
-- tool call's update, then a `turn` event for each turn that ended cancelled.
local function emit_archive_events(archived, turns, stream_max)
  local closed = {}
  for i = 1, #archived, 2 do
    emit_event(event_archived(archived[i], archived[i + 1]), stream_max)
    closed[#closed + 1] = archived[i]
  end
  -- The gate's closure, for the processes that stop their work (orchestrator/session/gate.py).
  if #closed > 0 then redis.call('PUBLISH', K.gate_closed, cjson.encode(closed)) end
  for i = 1, #turns, 6 do
    local tid, tsid, to, settlement = turns[i], turns[i + 1], turns[i + 3], turns[i + 5]
    if settlement ~= '' then publish_update(tsid, settlement) end
    if to == TURN.CANCELLED then
      emit_event(event_turn(tsid, tid, to, STOP_REASON[to]), stream_max)
    end
  end
end

-- Move a turn to a terminal state; if it was the session's running turn, promote the oldest
-- queued turn (unless no_promote: an archive starts nothing). pre: what the caller read of
-- the turn already, {sid = its sessionId, held = whether it has a heldTag}. Returns the
-- promoted id or ''.
local function finish_turn(tid, state, reason, err, ms, iso_time, no_promote, pre)
  local tk = K.turn(tid)
  local sid = pre and pre.sid or redis.call('HGET', tk, 'sessionId')
  redis.call('HSET', tk, 'state', state, 'stopReason', reason, 'error', err, 'endedAt', iso_time)
  -- The sweeper's note of a held delivery is about a step of a running turn: none is left.
  if not pre or pre.held then redis.call('HDEL', tk, 'heldTag', 'heldMs') end
  redis.call('DEL', K.step_lease(tid))
  redis.call('ZREM', K.live_turns(sid), tid)
  redis.call('ZREM', K.turns_inflight, tid)
  local s = redis.call('HMGET', skey(sid), 'parentId', 'deleted', 'cwdHash', 'archived',
    'updatedMs')
  sync_busy(sid, s)
  local active_key = K.active_turn(sid)
  if redis.call('GET', active_key) ~= tid then return '' end
  redis.call('DEL', active_key)
  -- A turn that ends within TOUCH_QUIET_MS of the session's last touch (its prompt, for a
  -- short turn) leaves updatedAt there: five writes fewer per short turn.
  if ms - (tonumber(s[5]) or 0) >= TOUCH_QUIET_MS then
    touch(sid, ms, iso_time, {s[3], s[4], s[2]})
  end
  if no_promote then return '' end
  for _, nxt in ipairs(redis.call('ZRANGE', K.live_turns(sid), 0, -1)) do
    if redis.call('HGET', K.turn(nxt), 'state') == TURN.QUEUED then
      redis.call('HSET', K.turn(nxt), 'state', TURN.RUNNING)
      redis.call('SET', active_key, nxt)
      redis.call('ZADD', K.turns_inflight, server_ms(), nxt)
      return nxt
    end
  end
  return ''
end

-- Keeps the turn's openCall field (HASH turn:<tid>) on the tool call its step has open: set
-- by a tool_call update, cleared by the update that settles that call.
local function note_open_call(tid, update_json)
  local u = cjson.decode(update_json)
  if u.sessionUpdate == 'tool_call' and u.status == 'in_progress' then
    redis.call('HSET', K.turn(tid), 'openCall', u.toolCallId)
  elseif u.sessionUpdate == 'tool_call_update' then
    redis.call('HDEL', K.turn(tid), 'openCall')
  end
end

-- Appends a step's session/update (its JSON) to the conversation of sid, notes the tool call
-- it opens or settles (note_open_call) and publishes it (publish_update).
local function append_update(tid, sid, update_json)
  redis.call('RPUSH', K.history(sid), update_json)
  note_open_call(tid, update_json)
  publish_update(sid, update_json)
end

-- Settles the tool call the turn has open as status ('cancelled', 'failed') with text, in the
-- caller's script: an archive settles a stopped turn's call cancelled (nothing lands after the
-- archive: the step's own settlement is refused by then), and a step's new copy settles the
-- call its lost copy left open failed (that copy's settlement is refused: it no longer owns
-- the step), so the conversation never ends on a call in progress.
-- call: the turn's openCall field when the caller read it already. Returns the settlement
-- written (JSON) or ''.
local function settle_open_call(tid, sid, status, text, call)
  if call == nil then call = redis.call('HGET', K.turn(tid), 'openCall') end
  if not call then return '' end
  redis.call('HDEL', K.turn(tid), 'openCall')
  local settlement = cjson.encode({
    sessionUpdate = 'tool_call_update', turnId = tid, toolCallId = call, status = status,
    content = {{type = 'content', content = {type = 'text', text = text}}}})
  redis.call('RPUSH', K.history(sid), settlement)
  return settlement
end

-- The cancel rule of a turn, the one place it is written (a user's stop, turn_cancel.lua; an
-- archive's, stop_turns_for_archive): a queued turn ends cancelled; a running one with a step
-- in flight (its lease held) becomes cancelling and the step settles it; a running one
-- between steps ends cancelled. st is its state as the caller read it; by, when given, is
-- recorded as its cancelledBy; err and no_promote are finish_turn's for a turn that ends.
-- Returns the state it moved to (nil: st is neither queued nor running, nothing changed) and
-- the turn promoted in its place ('' when none).
local function cancel_turn(tid, st, ms, now, by, err, no_promote)
  local tk = K.turn(tid)
  if st == TURN.RUNNING and redis.call('EXISTS', K.step_lease(tid)) == 1 then
    if by then
      redis.call('HSET', tk, 'state', TURN.CANCELLING, 'cancelledBy', by)
    else
      redis.call('HSET', tk, 'state', TURN.CANCELLING)
    end
    return TURN.CANCELLING, ''
  end
  if st ~= TURN.QUEUED and st ~= TURN.RUNNING then return nil, '' end
  if by then redis.call('HSET', tk, 'cancelledBy', by) end
  local to = TURN.CANCELLED
  return to, finish_turn(tid, to, STOP_REASON[to], err, ms, now, no_promote)
end

-- An archive stops the live turns of sid in its own script, so nothing a step of them does
-- can land after the archive commits (every step write is conditional on running): each by
-- cancel_turn, nothing promoted, an open tool call settled (settle_open_call). Each turn it
-- stops is marked cancelledBy `by` (CANCELLED_BY.ARCHIVE unless given, CANCELLED_BY.DELETE
-- for a delete's archive), which the paths that later settle a cancelling one keep, so the
-- turn says why it ended whoever finishes it. Call it after the archive write. Appends tid,
-- sid, previous state, new state, label, settlement ('' when none) for each turn to out.
local function stop_turns_for_archive(sid, out, by)
  by = by or CANCELLED_BY.ARCHIVE
  local ms, now -- read once, at the first turn (most archived sessions have none)
  for _, t in ipairs(redis.call('ZRANGE', K.live_turns(sid), 0, -1)) do
    if not ms then
      ms = server_ms()
      now = iso_ms(ms)
    end
    local h = redis.call('HMGET', K.turn(t), 'state', 'label')
    local to = cancel_turn(t, h[1], ms, now, by, 'archived', true)
    if to then
      local settlement = settle_open_call(t, sid, CALL.CANCELLED, 'stopped by the archive')
      out[#out + 1] = t; out[#out + 1] = sid; out[#out + 1] = h[1]; out[#out + 1] = to
      out[#out + 1] = h[2] or ''; out[#out + 1] = settlement
    end
  end
end

-- Calls fn with list in parts of at most 2,000 elements (an even count, so flat pairs stay
-- whole), for variadic calls: a Lua stack holds a few thousand arguments.
local function each_chunk(list, fn)
  for j = 1, #list, 2000 do
    fn({unpack(list, j, math.min(j + 1999, #list))})
  end
end

-- The lineage depth of each session of ids that is not a root: a flat list position
-- (1-based), depth. Most sessions are roots, and cost one LLEN.
local function lineage_depths(ids)
  local out = {}
  for i, sid in ipairs(ids) do
    local n = redis.call('LLEN', K.lineage(sid))
    if n > 0 then
      out[#out + 1] = i
      out[#out + 1] = n
    end
  end
  return out
end

-- The session hash fields naming, while the newest entries of its trail wait outside its list
-- (defer_trail), the bulk batch whose hash (Keys.audit_batch) holds each: two slots, the
-- older first. Two, as one bulk request can give a session two entries: its ancestor's
-- archive and its own (found archived).
local TRAIL_SLOTS = {'trailBatch', 'trail2Batch'}

-- The field of Keys.audit_batch that holds the entry of sid's slot i.
local function trail_field(sid, i) return sid .. ':' .. i end

local function trail_entry(id, at, action, outcome, actor, detail)
  return cjson.encode({id = id, at = at, action = action, outcome = outcome, actor = actor,
    detail = detail})
end

-- Which batches hold sid's waiting entries: {slot 1's batch or false, slot 2's or false}.
local function trail_waiting(sid)
  local b = redis.call('HMGET', skey(sid), TRAIL_SLOTS[1], TRAIL_SLOTS[2])
  return {b[1], b[2]}
end

-- The entry of sid's slot i waiting in batch (its JSON), or false.
local function batch_entry(sid, i, batch)
  return redis.call('HGET', K.audit_batch(batch), trail_field(sid, i))
end

-- Moves the entries waiting in batches (defer_trail) to the end of sid's trail list, oldest
-- first, so the next entry lands after them. waiting is trail_waiting's answer (read here
-- when nil). An entry of the caller's own batch that it has not written yet (rec.held) is
-- taken from there. Returns the list's length after the move (0: nothing moved).
local function flush_trail(rec, sid, waiting)
  waiting = waiting or trail_waiting(sid)
  local n = 0
  for i = 1, #TRAIL_SLOTS do
    local batch = waiting[i]
    if batch then
      local field = trail_field(sid, i)
      local entry = rec.held and batch == rec.batch and rec.held[field]
      if entry then
        rec.held[field] = nil
      else
        entry = batch_entry(sid, i, batch)
        redis.call('HDEL', K.audit_batch(batch), field)
      end
      redis.call('HDEL', skey(sid), TRAIL_SLOTS[i])
      if entry then n = redis.call('RPUSH', rec.auditSession .. sid, entry) end
    end
  end
  return n
end

-- Trims the trail list of sid, n entries long, exactly to rec.maxSession entries.
local function trim_trail(rec, sid, n)
  if n > rec.maxSession then
    redis.call('LTRIM', rec.auditSession .. sid, n - rec.maxSession, -1)
  end
end

-- Appends an audit entry (its fields; id is the fleet-wide stream's) to the trail of sid
-- (Keys.audit_log, a LIST, under the key prefix rec.auditSession), after any entry waiting
-- in a batch, trimmed exactly to rec.maxSession entries.
local function push_trail(rec, sid, id, at, action, outcome, detail)
  flush_trail(rec, sid)
  trim_trail(rec, sid, redis.call('RPUSH', rec.auditSession .. sid,
    trail_entry(id, at, action, outcome, rec.actor, detail)))
end

-- push_trail for a bulk archive batch (rec.batch its id, rec.held = {} its entries until
-- write_held_trail, rec.waiting = {}): the entry waits in the batch's hash (Keys.audit_batch)
-- until the session's next entry moves it to the list (flush_trail), so a bulk over sessions
-- with no trail yet adds no key per session to Redis's key table (docs/benchmarks.md, "Why
-- the million missed") and only one short field to each session's hash. Readers merge them
-- (audit_trail.lua). With both slots taken, their entries move to the list first.
-- rec.waiting (sid -> trail_waiting's answer) is kept current; a caller that read the slots
-- with the rest of the session's hash puts them there first, saving the read here. Returns the
-- session hash field and value that name the batch: the caller writes them, with its own
-- write of that hash.
local function defer_trail(rec, sid, id, at, action, outcome, detail)
  local waiting = rec.waiting[sid] or trail_waiting(sid)
  local slot = 1
  if waiting[1] and not waiting[2] then
    slot = 2
  elseif waiting[1] then
    trim_trail(rec, sid, flush_trail(rec, sid, waiting))
  end
  rec.waiting[sid] = slot == 2 and {waiting[1], rec.batch} or {rec.batch, false}
  rec.held[trail_field(sid, slot)] = trail_entry(id, at, action, outcome, rec.actor, detail)
  return TRAIL_SLOTS[slot], rec.batch
end

-- Writes the entries defer_trail held to the batch's hash, in one variadic HSET per 1,000.
local function write_held_trail(rec)
  local flat = {}
  for field, entry in pairs(rec.held) do
    flat[#flat + 1] = field
    flat[#flat + 1] = entry
  end
  each_chunk(flat, function(part) redis.call('HSET', K.audit_batch(rec.batch), unpack(part)) end)
end

-- The fleet-wide stream's entry of an audit record (the fields of orchestrator/storage/audit.py);
-- action, when given, is this entry's own, else rec.action; detail defaults to rec.detail.
-- With untrimmed, the stream is not trimmed here: the caller, recording many entries, trims
-- it once with trim_audit_all before its script ends (nothing outside the script can read it
-- in between). Returns the entry id.
local function audit_stream_add(rec, sid, outcome, at, detail, untrimmed, action)
  local fields = {'at', at, 'action', action or rec.action, 'outcome', outcome, 'actor',
    rec.actor, 'sessionId', sid, 'detail', detail or rec.detail}
  if untrimmed then return redis.call('XADD', rec.auditAll, '*', unpack(fields)) end
  return redis.call('XADD', rec.auditAll, 'MAXLEN', rec.maxGlobal, '*', unpack(fields))
end

-- Appends an audit entry in the script that makes the change, so the record commits with it
-- (the fields and the exact trimming of orchestrator/storage/audit.py). rec is the JSON the caller
-- built with audit.script_recorder: keys, caps, action, actor, default detail; action, when
-- given, is this entry's own. The fleet-wide stream's entry id is the entry's id; the
-- session's trail (Keys.audit_log, a LIST) gets the same entry as JSON with that id.
-- untrimmed as audit_stream_add. Returns the entry id.
local function record_in_script(rec, sid, outcome, at, detail, untrimmed, action)
  action = action or rec.action
  detail = detail or rec.detail
  local id = audit_stream_add(rec, sid, outcome, at, detail, untrimmed, action)
  push_trail(rec, sid, id, at, action, outcome, detail)
  return id
end

-- The detail of the entry an ancestor's transition leaves in a descendant's trail
-- (audit.detail_json's form).
local function ancestor_detail(ancestor) return detail_ancestor(ancestor) end

-- Records in the trail of each session of descendants (a list of ids), and there only, that
-- the transition of ancestor whose entry is id (record_in_script's reply) archived or restored
-- it: that entry's action (rec.action unless given), outcome, actor and time, detail
-- {"ancestorId": ancestor}. The fleet-wide stream keeps its one entry per request; the id
-- leads to it.
local function record_descendants(rec, id, ancestor, descendants, outcome, at, action)
  local detail = ancestor_detail(ancestor)
  for _, d in ipairs(descendants) do
    push_trail(rec, d, id, at, action or rec.action, outcome, detail)
  end
end

-- Trims the fleet-wide audit stream to its cap (exactly), after record_in_script(...,
-- untrimmed) calls.
local function trim_audit_all(rec)
  redis.call('XTRIM', rec.auditAll, 'MAXLEN', rec.maxGlobal)
end
