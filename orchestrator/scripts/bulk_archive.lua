-- ARGV: prefix, stopActivity '0'|'1', dryRun '0'|'1', nowIso ('' for the server's clock),
--       txnBase, idleBeforeMs|'',
--       withUnarchive '0'|'1', record (JSON, see below), sid...
-- One batch of a bulk archive: for each session, in order, exactly what archive.lua does (the
-- live-work check, unless stopActivity, and the archive write of the session and its whole
-- subtree, atomically), so a batch behaves like that many single archives run back to back.
-- Each session archived here gets a transition of its own (txnBase.<position>), so unarchive
-- restores it exactly as it would after a single archive.
-- With dryRun nothing is written: sessions the batch would have archived are remembered in
-- this script only, so a descendant after its ancestor in the same batch reads 'already'.
-- With idleBeforeMs (a filter on last activity), a session whose idle clock is no longer
-- older than it is skipped: the clock is updatedMs, or max(updatedMs, unarchivedMs) with
-- withUnarchive (the auto-archive policy), read in the same step as the write.
-- With stopActivity the live turns of every session it archives are stopped in this same
-- script (stop_turns_for_archive in _lib.lua).
-- Every session it archives gets its 'archived' event, and every turn it stops its events,
-- emitted here as archive.lua emits them (so they commit with the batch): all the archived
-- events of the batch in order (a session before its descendants), then the turn events.
--
-- Per session the script reads each session hash once (HMGET, cached for the batch) and
-- writes it once; an idle session without children costs one EXISTS over its children set
-- and every family's item key. The archived set and the listing indexes are updated once
-- per batch (variadic SADD/ZREM/ZADD, at the end of this same script, so nothing outside it
-- can tell).
--
-- Returns {codes, extras}:
--   codes   one character per session, in order: 'a' archived, 'l' already archived,
--           'n' not found, 's' skipped, 'x' active (live work and no stopActivity); upper
--           case ('A', 'L', 'X') when its subtree has live work (computed for active, for
--           archived, and with stopActivity for already), so callers read the census only then
--   extras  flat list position (1-based), would, turns, census for the sessions that have
--           any of them:
--           would  dry run only: the ids the transition would have archived
--           turns  flat list tid, sid, fromState, toState, label, settlement of the turns it
--                  stopped (settlement: the tool-call settlement it wrote, JSON, or '')
--           census with stopActivity, for a session archived ('A') or found archived ('L')
--                  with live work in its subtree: subtree_census (_lib.lua), read right after
--                  its own write (or with the archive it found), in this same atomic step, so
--                  the stops name only what lived under this archive, never work created
--                  after an unarchive that comes before the stops are sent
local stop, dry, now, base = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if now == '' then now = iso_ms(server_ms()) end
local idle_before, with_unarchive = tonumber(ARGV[6]), ARGV[7] == '1'
local FIRST = 9
-- sid -> {deleted, archived, updatedMs, unarchivedMs, cwdHash, trailBatch, trail2Batch}, as
-- read (archived kept current by this script; the last two name the batches holding its
-- waiting audit trail entries, for defer_trail).
local meta = {}

local function read(s)
  local h = meta[s]
  if not h then
    h = redis.call('HMGET', skey(s), 'deleted', 'archived', 'updatedMs', 'unarchivedMs',
      'cwdHash', TRAIL_SLOTS[1], TRAIL_SLOTS[2])
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

-- The batch's audit entries and archive counts commit with it: a crash after this script
-- leaves no archive unaudited or uncounted, and a retry finds them 'already'. ARGV[8] is
-- audit.script_recorder's JSON plus outcomes = {scriptOutcome = recordedOutcome}, metric =
-- the fleet_archives key and eventsMax = the event stream's cap; refusals are recorded by the
-- caller, which learns the live items from the census. Each session's trail entry waits in
-- this batch's hash (defer_trail, the batch's id being its transition base), its hash naming
-- the batch in the same write as its archive, so a batch adds no key per session. Each
-- descendant a session's transition archived gets that session's entry in its own trail.
local rec
local counts = {} -- recorded outcome -> sessions
if dry ~= '1' then
  rec = cjson.decode(ARGV[8])
  rec.batch, rec.held, rec.waiting = base, {}, {}
end
local names = {a = 'archived', l = 'already', n = 'not_found', s = 'skipped', x = 'active'}

-- The fleet-wide audit entry of sid's outcome code, when the caller records that outcome:
-- its id and the recorded outcome, or nil.
local function stream_entry(sid, code)
  local recorded = rec and rec.outcomes[names[string.lower(code)]]
  if not recorded then return nil end
  counts[recorded] = (counts[recorded] or 0) + 1
  return audit_stream_add(rec, sid, recorded, now, nil, true), recorded
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

-- Records the outcome code of sid, whose hash this script does not write otherwise.
local function record_alone(sid, code)
  local id, recorded = stream_entry(sid, code)
  if id then redis.call('HSET', skey(sid), waiting_entry(sid, id, recorded, rec.detail)) end
end

local codes, extras = {}, {}
local moved = {} -- sessions archived, in order (the set and index updates at the end)
local events = {} -- sid, historyLength of every session archived, in order
local stopped = {} -- the turns stopped, flat as stop_turns_for_archive lists them
for i = FIRST, #ARGV do
  local sid = ARGV[i]
  local h = read(sid)
  local code
  if h[1] ~= '0' then
    code = 'n'
  elseif h[2] == '1' then
    code = 'l'
    if stop == '1' and any_live(tree(sid)) == 1 then
      code = 'L'
      if dry ~= '1' then
        extras[#extras + 1] = i - FIRST + 1
        extras[#extras + 1] = {}
        extras[#extras + 1] = {}
        extras[#extras + 1] = subtree_census(sid)
      end
    end
    record_alone(sid, code)
  elseif not idle_enough(h) then
    code = 's'
    record_alone(sid, code)
  else
    local nodes = tree(sid)
    local busy = any_live(nodes)
    if busy == 1 and stop ~= '1' then
      code = 'X'
    else
      local txn = base .. '.' .. (i - FIRST + 1)
      code = busy == 1 and 'A' or 'a'
      local id, recorded = stream_entry(sid, code)
      local would, turns = {}, {}
      for _, s in ipairs(nodes) do
        local m = read(s)
        if m[2] ~= '1' then
          m[2] = '1'
          if dry == '1' then
            would[#would + 1] = s
          else
            -- Its trail entry (a descendant's: the session's, with its ancestor named) waits
            -- in the batch's hash, and the archive write names the batch.
            local trail = {}
            if id then
              local detail = s == sid and rec.detail or ancestor_detail(sid)
              trail = {waiting_entry(s, id, recorded, detail)}
            end
            -- An idle subtree is quiet from its archive on (what archive.py records with
            -- mark_quiet); a busy one is marked by the census after its stops.
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
            if stop == '1' and busy == 1 then stop_turns_for_archive(s, turns) end
            events[#events + 1] = s
            events[#events + 1] = redis.call('LLEN', K.history(s))
          end
        end
      end
      -- The census after this session's write and the stops of its turns.
      local census = {}
      if stop == '1' and busy == 1 and dry ~= '1' then census = subtree_census(sid) end
      if #would > 0 or #turns > 0 or #census > 0 then
        extras[#extras + 1] = i - FIRST + 1
        extras[#extras + 1] = would
        extras[#extras + 1] = turns
        extras[#extras + 1] = census
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

-- The audit entries held for the batch's hash, the fleet-wide stream's cap, the counts and
-- the events, as archive.lua emits them.
if rec then
  write_held_trail(rec)
  trim_audit_all(rec)
  for outcome, n in pairs(counts) do redis.call('HINCRBY', rec.metric, outcome, n) end
  emit_archive_events(events, stopped, rec.eventsMax or 10000)
end
return {table.concat(codes), extras}
