-- ARGV: prefix, stopActivity '0'|'1', dryRun '0'|'1', nowIso, txnBase, idleBeforeMs|'',
--       withUnarchive '0'|'1', record (JSON, see the end of the script), sid...
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
-- Returns one row per session: {sid, outcome, n, busy, would, turns, changed}
--   outcome 'not_found' | 'already' | 'skipped' | 'active' | 'archived'
--   n       sessions this transition archived (or would archive) in the subtree
--   busy    1 when the subtree has live work (computed for 'active', for 'archived', and
--           with stopActivity for 'already'), so callers read the census only then
--   would   dry run only: the ids the transition would have archived
--   turns   flat list tid, sid, fromState, toState, label, settlement of the turns it
--           stopped (settlement: the tool-call settlement it wrote, JSON, or '')
--   changed flat list sid, historyLength of every session it archived (the session first, then
--           its descendants), so each gets its own 'archived' event
local stop, dry, now, base = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idle_before, with_unarchive = tonumber(ARGV[6]), ARGV[7] == '1'
local FIRST = 9
local virtual = {}

local function idle_enough(k)
  if not idle_before then return true end
  local h = redis.call('HMGET', k, 'updatedMs', 'unarchivedMs')
  local clock = tonumber(h[1]) or 0
  if with_unarchive then clock = math.max(clock, tonumber(h[2]) or 0) end
  return clock < idle_before
end

local function is_archived(s)
  return virtual[s] or redis.call('HGET', skey(s), 'archived') == '1'
end

local function any_live(nodes)
  for _, s in ipairs(nodes) do
    if has_live(s) then return 1 end
  end
  return 0
end

local out = {}
for i = FIRST, #ARGV do
  local sid = ARGV[i]
  local k = skey(sid)
  if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
    out[#out + 1] = {sid, 'not_found', 0, 0, {}, {}, {}}
  elseif is_archived(sid) then
    local busy = 0
    if stop == '1' then busy = any_live(subtree(sid)) end
    out[#out + 1] = {sid, 'already', 0, busy, {}, {}, {}}
  elseif not idle_enough(k) then
    out[#out + 1] = {sid, 'skipped', 0, 0, {}, {}, {}}
  else
    local nodes = subtree(sid)
    local busy = any_live(nodes)
    if busy == 1 and stop ~= '1' then
      out[#out + 1] = {sid, 'active', 0, 1, {}, {}, {}}
    else
      local txn = base .. '.' .. (i - FIRST + 1)
      local n, would, turns, changed = 0, {}, {}, {}
      for _, s in ipairs(nodes) do
        if not is_archived(s) then
          if dry == '1' then
            virtual[s] = true
            would[#would + 1] = s
          else
            redis.call('HSET', skey(s), 'archived', '1', 'archivedAt', now, 'archiveTxn', txn)
            -- An idle subtree is quiet from its archive on (what archive.py records with
            -- mark_quiet); a busy one is marked by the census after its stops.
            if busy == 0 then redis.call('HSET', skey(s), 'quietAt', now, 'quietTxn', txn) end
            redis.call('SADD', K.archived, s)
            move_index(s, 'active', 'archived')
            if stop == '1' then stop_turns_for_archive(s, turns) end
            changed[#changed + 1] = s
            changed[#changed + 1] = redis.call('LLEN', K.history(s))
          end
          n = n + 1
        end
      end
      out[#out + 1] = {sid, 'archived', n, busy, would, turns, changed}
    end
  end
end
-- The batch's audit entries and archive counts commit with it: a crash after this script
-- leaves no archive unaudited or uncounted, and a retry finds them 'already'. ARGV[8] is
-- audit.script_recorder's JSON plus outcomes = {scriptOutcome = recordedOutcome} and
-- metric = the fleet_archives key; refusals are recorded by the caller, which learns the
-- live items from the census.
if dry ~= '1' then
  local rec = cjson.decode(ARGV[8])
  local counts = {}
  for _, row in ipairs(out) do
    local recorded = rec.outcomes[row[2]]
    if recorded then
      counts[recorded] = (counts[recorded] or 0) + 1
      record_in_script(rec, row[1], recorded, now)
    end
  end
  for outcome, n in pairs(counts) do redis.call('HINCRBY', rec.metric, outcome, n) end
end
return out
