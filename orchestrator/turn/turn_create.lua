-- ARGV: prefix, sid, tid, prompt, label, source, nowMs|'', nowIso|'', guardTid|'', reminderId|'',
--   guardToken|'', idemDigest|'', idemFingerprint, idemTtlMs
-- nowMs '' reads the server's clock here (TIME).
-- With idemDigest (a client's idempotency key, scoped to the session;
-- orchestrator/storage/idempotency.py) a key seen before answers {'replay', tid} (the turn it created)
-- or {'key_reused'} (another prompt) and stores nothing; a stored turn records the key here.
-- Stores a turn; it runs at once if the session has no running turn, else it queues.
-- Refused on an archived lineage whatever its source (a late wake-up stores nothing, and
-- leaves the conversation and updatedAt as the archive left them), and, with guardTid (a
-- subagent's first turn started by a step), when the guarding turn no longer runs or that copy
-- of its step (guardToken) no longer owns it (step_owns).
-- Returns {'run'} | {'queued'} | {'replay', tid} | {'key_reused'} | {'not_found'}
--   | {'archived', holder} | {'stopped'}; for a reminder also {'duplicate', turnId}
local sid, tid, prompt, label, source = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ms = tonumber(ARGV[7]) or server_ms()
local now = ARGV[8] ~= '' and ARGV[8] or iso_ms(ms)
local k = skey(sid)
-- [reminder] ARGV[10]: the id of the reminder this turn fires, or ''. One turn per reminder:
-- a repeat fire gets {'duplicate', turnId}; a stopped one {'stopped'}; under an archived
-- lineage it is 'refused' ({'archived', holder}), on a deleted session 'dropped'; all store
-- nothing. Otherwise it is spent here ('fired', turnId) and the turn below is created.
local rid = ARGV[10] or ''
if rid ~= '' then
  local rk = K.reminder(rid)
  local r = redis.call('HMGET', rk, 'state', 'turnId', 'sessionId')
  if r[2] then return {'duplicate', r[2]} end
  if r[1] ~= REMINDER.ARMED and r[1] ~= REMINDER.FIRING then return {'stopped'} end
  local gone = redis.call('HGET', k, 'deleted') ~= '0'
  local holder = (not gone) and archived_in_lineage(sid)
  redis.call('ZREM', K.reminders_due, rid)
  redis.call('ZREM', K.reminders_firing, rid)
  redis.call('SREM', K.live_reminders(r[3]), rid)
  sync_busy(r[3])
  if gone then redis.call('HSET', rk, 'state', REMINDER.DROPPED); return {'not_found'} end
  if holder then redis.call('HSET', rk, 'state', REMINDER.REFUSED); return {'archived', holder} end
  redis.call('HSET', rk, 'state', REMINDER.FIRED, 'turnId', tid)
end
-- [/reminder]
-- A deleted session answers not_found to a replay too, as a replayed creation of it does.
local s = redis.call('HMGET', k, 'deleted', 'parentId', 'cwdHash', 'archived')
if s[1] ~= '0' then return {'not_found'} end
local root = not s[2] or s[2] == ''
local idem, fp = ARGV[12] or '', ARGV[13] or ''
local seen = idem_seen(sid, idem, fp)
if seen then return seen end
local holder = archived_in_lineage(sid, root)
if holder then return {'archived', holder} end
if not step_owns(ARGV[9], ARGV[11]) then return {'stopped'} end
-- The session's active turn is taken here when it has none: this turn runs at once.
local state = TURN.QUEUED
if redis.call('SET', K.active_turn(sid), tid, 'NX') then state = TURN.RUNNING end
redis.call('HSET', K.turn(tid), 'turnId', tid, 'sessionId', sid, 'state', state,
  'prompt', prompt, 'label', label, 'source', source, 'step', 0, 'stopReason', '',
  'error', '', 'createdAt', now, 'endedAt', '')
-- Ordered by a per-session sequence, not the clock: prompts sent within one millisecond
-- still run in the order they arrived.
redis.call('ZADD', K.live_turns(sid), redis.call('INCR', K.turn_seq(sid)), tid)
if not root then sync_busy(sid, {s[2], s[1]}) end
touch(sid, ms, now, {s[3], s[4], s[1]})
idem_record(sid, idem, fp, tid, ARGV[14])
if state == TURN.RUNNING then
  redis.call('ZADD', K.turns_inflight, ARGV[7] == '' and ms or server_ms(), tid)
  return {'run'}
end
return {TURN.QUEUED}
