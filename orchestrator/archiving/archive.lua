-- ARGV: prefix, stopActivity '0'|'1', dryRun '0'|'1', nowIso ('' for the server's clock),
--       txnBase, idleBeforeMs|'', withUnarchive '0'|'1', record (JSON, see below),
--       confirmed ('' or a JSON array of 'family:id' strings), sid...
-- The archive transition, for one session or a batch of many (a single archive is a batch of
-- one): for each session, in order, the live-work check (unless stopActivity) and the archive
-- write of the session and its whole subtree, atomically, so no work can start unseen between
-- the check and the write, and a batch behaves like that many archives of one run back to
-- back. Each session archived here gets a transition of its own (txnBase.<position>), so
-- unarchive restores exactly what it archived.
-- With dryRun nothing is written: sessions the batch would have archived are remembered in
-- this script only, so a descendant after its ancestor in the same batch reads 'already'.
-- With idleBeforeMs (a filter on last activity), a session whose idle clock is no longer
-- older than it is skipped: the clock is updatedMs, or max(updatedMs, unarchivedMs) with
-- withUnarchive (the auto-archive policy), read in the same step as the write.
-- With stopActivity the live turns of every session it archives are stopped in this same
-- script (stop_turns_for_archive in _lib.lua; record.cancelledBy is what they record).
-- With stopActivity and confirmed, a session is refused ('c', nothing written) when an item
-- is live now that was not confirmed, named as the census names it: turn:, job:, reminder:
-- ids of the session itself, subagent:<descendant id> for a descendant with live work of its
-- own (orchestrator/census/activity.py).
-- Every session it archives gets its 'archived' event, and every turn it stops its events,
-- emitted here (so they commit with the write): all the archived events in order (a session
-- before its descendants; historyLength: its history's length once its turns were stopped),
-- then per stopped turn its tool-call settlement ('update') and, for a turn that ended, its
-- 'turn' event.
--
-- Quiet: a session found with no live work in its subtree is recorded quiet here
-- (quietAt/quietTxn of its transition, mark_transition_quiet): an idle subtree in its
-- archive's own write; with stopActivity also a subtree whose turns were all this script's
-- to stop, and one found archived with nothing live under it. With stopActivity each session
-- so recorded is observed in the quiet histogram (record.quiet: its key, bucket bounds and
-- fields), the seconds since its archive (0 for its own).
--
-- Per session the script reads each session hash once (HMGET, cached for the batch) and
-- writes it once; an idle session without children costs one EXISTS over its children set
-- and every family's item key. The archived set and the listing indexes are updated once
-- per batch (variadic SADD/ZREM/ZADD, at the end of this same script, so nothing outside it
-- can tell).
--
-- Returns {codes, extras}:
--   codes   one character per session, in order: 'a' archived, 'l' already archived,
--           'n' not found, 's' skipped, 'x' active (live work and no stopActivity), 'c'
--           changed (live work beyond confirmed); upper case ('A', 'L', 'X') when its subtree
--           has live work (computed for active, for archived, and with stopActivity for
--           already), so callers read the census only then
--   extras  flat list position (1-based), would, turns, census, count, txn for the sessions
--           that have any of would, turns or census, and for every session of a batch of one:
--           would  dry run only: the ids the transition would have archived
--           turns  flat list tid, sid, fromState, toState, label, settlement of the turns it
--                  stopped (settlement: the tool-call settlement it wrote, JSON, or '')
--           census with stopActivity, for a session archived ('A') or found archived ('L')
--                  with live work in its subtree: subtree_census (_lib.lua), read right after
--                  its own write (or with the archive it found), in this same atomic step, so
--                  the stops name only what lived under this archive, never work created
--                  after an unarchive that comes before the stops are sent
--           count  the sessions its transition archived (0 unless archived)
--           txn    the transition it is archived by (its own, or the one found in place)
local stop, dry, now, base = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if now == '' then now = iso_ms(server_ms()) end
local idle_before, with_unarchive = tonumber(ARGV[6]), ARGV[7] == '1'
local FIRST = 10
-- A batch of one answers count and txn even when it has nothing else to say.
local one = #ARGV == FIRST
-- sid -> {deleted, archived, updatedMs, unarchivedMs, cwdHash, trailBatch, trail2Batch,
-- archiveTxn, quietTxn, archivedAt, parentId}, as read (archived kept current by this
-- script; trailBatch and trail2Batch name the batches holding its waiting audit trail
-- entries, for defer_trail).
local meta = {}

local function read(s)
  local h = meta[s]
  if not h then
    h = redis.call('HMGET', skey(s), 'deleted', 'archived', 'updatedMs', 'unarchivedMs',
      'cwdHash', TRAIL_SLOTS[1], TRAIL_SLOTS[2], 'archiveTxn', 'quietTxn', 'archivedAt',
      'parentId')
    meta[s] = h
  end
  return h
end

local function idle_enough(h)
  if not idle_before then return true end
  local clock = tonumber(h[3]) or 0
  if with_unarchive then clock = math.max(clock, tonumber(h[4]) or 0) end
  return clock < idle_before
end

-- sid -> its children, as read (no script changes them).
local kids = {}
-- sid -> what tree learnt of its item keys (item_keys in _lib.lua, for has_live): true none
-- exists, false some does, nil not known.
local bare = {}
-- sid -> true once an any_live found no live work in it: nothing in this script can start
-- any (it only archives, and stops turns of busy subtrees), so an already archived
-- descendant met later in the batch is known idle without reading its records again.
local idle = {}

-- s's children, read once for the batch.
local function children_of(s)
  local c = kids[s]
  if not c then
    -- Most sessions have no children and no items: one EXISTS over the children set and
    -- every family's item key says so, instead of a read of each.
    local keys = item_keys(s, {K.children(s)})
    if redis.call('EXISTS', unpack(keys)) == 0 then
      c = {}
      bare[s] = true
    else
      c = redis.call('SMEMBERS', K.children(s))
      -- No children: what exists is an item key. Children: it may be theirs only.
      if #c == 0 and #keys > 1 then bare[s] = false end
    end
    kids[s] = c
  end
  return c
end

local function cached_not_deleted(s) return read(s)[1] == '0' end

-- The session and every descendant that is not deleted, breadth first (subtree in _lib.lua,
-- reading each hash and children set through the caches).
local function tree(sid) return walk(sid, cached_not_deleted, children_of) end

local function any_live(nodes)
  for _, s in ipairs(nodes) do
    if not idle[s] and has_live(s, bare[s]) then return 1 end
  end
  for _, s in ipairs(nodes) do idle[s] = true end
  return 0
end

-- Whether, with stopActivity and confirmed, sid's subtree (nodes, sid first) has a live item
-- the confirmation does not name.
local confirmed
if stop == '1' and ARGV[9] ~= '' then
  confirmed = {}
  for _, item in ipairs(cjson.decode(ARGV[9])) do confirmed[item] = true end
end
local function unconfirmed(sid, nodes)
  for _, item in ipairs(live_items(sid)) do
    if not confirmed[item] then return true end
  end
  for i = 2, #nodes do
    if has_live(nodes[i]) and not confirmed['subagent:' .. nodes[i]] then return true end
  end
  return false
end

-- The batch's audit entries and archive counts commit with it: a crash after this script
-- leaves no archive unaudited or uncounted, and a retry finds them 'already'. ARGV[8] is
-- audit.script_recorder's JSON plus outcomes = {scriptOutcome = recordedOutcome}, metric =
-- the fleet_archives key, eventsMax = the event stream's cap, cancelledBy, straight (true for
-- a single archive) and, with stopActivity, quiet = {key, bounds, fields} of the quiet
-- histogram; refusals are recorded by
-- the caller, which learns the live items from the census. Each session's trail entry goes
-- straight into its trail (record.straight) or waits in this batch's hash (defer_trail, the
-- batch's id being its transition base), its hash naming the batch in the same write as its
-- archive, so a batch adds no key per session. Each descendant a session's transition archived
-- gets that session's entry in its own trail (detail {"ancestorId"}).
local rec
local counts = {} -- recorded outcome -> sessions
if dry ~= '1' then
  rec = cjson.decode(ARGV[8])
  rec.batch, rec.held, rec.waiting = base, {}, {}
end
-- With record.straight (a single archive), its audit entries go straight into the trails
-- (record_in_script); else they wait in the batch's own hash (defer_trail).
local straight = rec and rec.straight
local names = {a = 'archived', l = 'already', n = 'not_found', s = 'skipped', x = 'active',
  c = 'changed'}

-- The outcome sid's code is recorded as, when the caller records that outcome, else nil.
local function recorded_as(code)
  return rec and rec.outcomes[names[string.lower(code)]]
end

-- The fleet-wide audit entry of sid (recorded as recorded): its id.
local function stream_entry(sid, recorded, detail)
  counts[recorded] = (counts[recorded] or 0) + 1
  return audit_stream_add(rec, sid, recorded, now, detail, true)
end

-- The session hash field and value naming the batch where s's entry (id, outcome, detail)
-- waits (defer_trail, its waiting slots known from read).
local function waiting_entry(s, id, outcome, detail)
  if not rec.waiting[s] then
    local m = read(s)
    rec.waiting[s] = {m[6], m[7]}
  end
  return defer_trail(rec, s, id, now, rec.action, outcome, detail)
end

-- Records the outcome code of sid with detail, whose hash this script does not write
-- otherwise.
local function record_alone(sid, code, detail)
  local recorded = recorded_as(code)
  if not recorded then return end
  if straight then
    counts[recorded] = (counts[recorded] or 0) + 1
    record_in_script(rec, sid, recorded, now, detail, true)
  else
    local id = stream_entry(sid, recorded, detail)
    redis.call('HSET', skey(sid), waiting_entry(sid, id, recorded, detail))
  end
end

-- The quiet histogram's observations (with stopActivity): bucket field -> count, and the sum.
local quiet_seen, quiet_sum, quiet_n = {}, 0, 0
local function observe_quiet(seconds)
  if not (rec and rec.quiet) then return end
  seconds = math.max(0, seconds)
  local field = rec.quiet.fields[#rec.quiet.fields]
  for j, bound in ipairs(rec.quiet.bounds) do
    if seconds <= bound then field = rec.quiet.fields[j]; break end
  end
  quiet_seen[field] = (quiet_seen[field] or 0) + 1
  quiet_sum, quiet_n = quiet_sum + seconds, quiet_n + 1
end

-- Records the subtree of sid (nodes) quiet for its transition txn (archived at archivedAt),
-- observed when sid is the one its transition was asked for.
local function record_quiet(sid, nodes, txn, archived_at, parent)
  mark_transition_quiet(nodes, txn, now)
  if transition_root(parent, txn) == '1' then
    observe_quiet(((ms_of_iso(now) or 0) - (ms_of_iso(archived_at) or 0)) / 1000)
  end
end

local extras = {}
-- Whether a session of nodes has live work now, read afresh (after this script's stops).
local function live_now(nodes)
  for _, s in ipairs(nodes) do
    if has_live(s) then return true end
  end
  return false
end

local function add_extras(pos, would, turns, census, n, txn)
  extras[#extras + 1] = pos
  extras[#extras + 1] = would
  extras[#extras + 1] = turns
  extras[#extras + 1] = census
  extras[#extras + 1] = n
  extras[#extras + 1] = txn
end

local codes = {}
local moved = {} -- sessions archived, in order (the set and index updates at the end)
local events = {} -- sid, historyLength of every session archived, in order
local stopped = {} -- the turns stopped, flat as stop_turns_for_archive lists them
for i = FIRST, #ARGV do
  local sid = ARGV[i]
  local pos = i - FIRST + 1
  local h = read(sid)
  local code
  if h[1] ~= '0' then
    code = 'n'
    if one then add_extras(pos, {}, {}, {}, 0, '') end
  elseif h[2] == '1' then
    code = 'l'
    local census = {}
    if stop == '1' then
      local nodes = tree(sid)
      if any_live(nodes) == 1 then
        code = 'L'
        if dry ~= '1' then census = subtree_census(sid) end
      elseif dry ~= '1' and h[8] and h[8] ~= '' and h[9] ~= h[8] then
        record_quiet(sid, nodes, h[8], h[10] or now, h[11])
      end
    end
    if #census > 0 or one then add_extras(pos, {}, {}, census, 0, h[8] or '') end
    record_alone(sid, code, detail_already_archived(stop == '1'))
  elseif not idle_enough(h) then
    code = 's'
    if one then add_extras(pos, {}, {}, {}, 0, '') end
    record_alone(sid, code, rec and rec.detail)
  else
    local nodes = tree(sid)
    local busy = any_live(nodes)
    if busy == 1 and stop ~= '1' then
      code = 'X'
    elseif busy == 1 and confirmed and unconfirmed(sid, nodes) then
      code = 'c'
    else
      local txn = base .. '.' .. pos
      code = busy == 1 and 'A' or 'a'
      local recorded = recorded_as(code)
      -- The sessions this transition archives: the subtree's not yet archived.
      local fresh = {}
      for _, s in ipairs(nodes) do
        local m = read(s)
        if m[2] ~= '1' then
          m[2] = '1'
          fresh[#fresh + 1] = s
        end
      end
      local would, turns = {}, {}
      if dry == '1' then
        would = fresh
      else
        -- Without turns to stop, the entry is known before the write: in a larger batch each
        -- session's trail entry (a descendant's: the session's, with its ancestor named)
        -- waits in the batch's hash, named in the archive's own write.
        local stops = stop == '1' and busy == 1
        local id, detail
        if recorded and not stops then
          detail = detail_archived(#fresh, stop == '1', 0)
          if not straight then id = stream_entry(sid, recorded, detail) end
        end
        for _, s in ipairs(fresh) do
          local trail = {}
          if id then
            trail = {waiting_entry(s, id, recorded, s == sid and detail or ancestor_detail(sid))}
          end
          -- An idle subtree is quiet from its archive on; a busy one is marked once its
          -- turns are stopped, when they were all its live work.
          if busy == 0 then
            redis.call('HSET', skey(s), 'archived', '1', 'archivedAt', now, 'archiveTxn', txn,
              'quietAt', now, 'quietTxn', txn, unpack(trail))
          else
            redis.call('HSET', skey(s), 'archived', '1', 'archivedAt', now, 'archiveTxn', txn,
              unpack(trail))
          end
          moved[#moved + 1] = s
          -- Only queued and running turns are stopped, and they are live: an idle subtree
          -- has none to stop.
          if stops then stop_turns_for_archive(s, turns, rec and rec.cancelledBy) end
          events[#events + 1] = s
          events[#events + 1] = redis.call('LLEN', K.history(s))
        end
        if recorded and (stops or straight) then
          -- The entry once the turns are stopped (their count in it), written now.
          detail = detail_archived(#fresh, stop == '1', #turns / 6)
          if straight then
            counts[recorded] = (counts[recorded] or 0) + 1
            id = record_in_script(rec, sid, recorded, now, detail, true)
            local below = {}
            for j = 2, #fresh do below[#below + 1] = fresh[j] end
            record_descendants(rec, id, sid, below, recorded, now)
          else
            id = stream_entry(sid, recorded, detail)
            for _, s in ipairs(fresh) do
              redis.call('HSET', skey(s),
                waiting_entry(s, id, recorded, s == sid and detail or ancestor_detail(sid)))
            end
          end
        end
        if stop == '1' and busy == 0 then
          observe_quiet(0) -- marked quiet by its write
        elseif stops and not live_now(nodes) then
          record_quiet(sid, nodes, txn, now, h[11])
        end
      end
      -- The census after this session's write and the stops of its turns.
      local census = {}
      if stop == '1' and busy == 1 and dry ~= '1' then census = subtree_census(sid) end
      if #would > 0 or #turns > 0 or #census > 0 or one then
        add_extras(pos, would, turns, census, #fresh, txn)
        for _, v in ipairs(turns) do stopped[#stopped + 1] = v end
      end
    end
  end
  codes[#codes + 1] = code
end

if #moved > 0 then
  -- The archived set and the listing indexes (move_index in _lib.lua, per batch): each
  -- session keeps its score, its last activity.
  each_chunk(moved, function(part) redis.call('SADD', K.archived, unpack(part)) end)
  local by_cwd = {}
  for _, s in ipairs(moved) do
    local m = meta[s]
    local cwd = m[5] or ''
    by_cwd[cwd] = by_cwd[cwd] or {}
    local list = by_cwd[cwd]
    list[#list + 1] = tonumber(m[3]) or 0
    list[#list + 1] = s
  end
  local all = {}
  for cwd, pairs_ in pairs(by_cwd) do
    local members = {}
    for j = 2, #pairs_, 2 do members[#members + 1] = pairs_[j] end
    if cwd ~= '' then
      each_chunk(members, function(part) redis.call('ZREM', idx('active', cwd), unpack(part)) end)
      each_chunk(pairs_, function(part) redis.call('ZADD', idx('archived', cwd), unpack(part)) end)
    end
    for _, v in ipairs(pairs_) do all[#all + 1] = v end
  end
  local members = {}
  for j = 2, #all, 2 do members[#members + 1] = all[j] end
  each_chunk(members, function(part) redis.call('ZREM', idx('active'), unpack(part)) end)
  each_chunk(all, function(part) redis.call('ZADD', idx('archived'), unpack(part)) end)
end

-- The audit entries held for the batch's hash, the fleet-wide stream's cap, the counts, the
-- quiet observations and the events.
if rec then
  write_held_trail(rec)
  trim_audit_all(rec)
  for outcome, n in pairs(counts) do redis.call('HINCRBY', rec.metric, outcome, n) end
  if quiet_n > 0 then
    for field, n in pairs(quiet_seen) do redis.call('HINCRBY', rec.quiet.key, field, n) end
    redis.call('HINCRBYFLOAT', rec.quiet.key, 'sum', tostring(quiet_sum))
  end
  emit_archive_events(events, stopped, rec.eventsMax or 10000)
end
return {table.concat(codes), extras}
