-- ARGV: prefix, sid, tid, prompt, label, source, nowMs, nowIso, refuseIfArchived '0'|'1'
-- Stores a turn; it runs at once if the session has no running turn, else it queues.
-- Returns {'run'} | {'queued'} | {'not_found'} | {'archived', holder}
local sid, tid, prompt, label, source = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ms, now, refuse = tonumber(ARGV[7]), ARGV[8], ARGV[9]
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
if refuse == '1' then
  local holder = archived_in_lineage(sid)
  if holder then return {'archived', holder} end
end
local active_key = P .. 'turn:active:' .. sid
local state = 'queued'
if redis.call('EXISTS', active_key) == 0 then state = 'running' end
redis.call('HSET', P .. 'turn:' .. tid, 'turnId', tid, 'sessionId', sid, 'state', state,
  'prompt', prompt, 'label', label, 'source', source, 'step', 0, 'stopReason', '',
  'error', '', 'createdAt', now, 'endedAt', '')
-- Ordered by a per-session sequence, not the clock: prompts sent within one millisecond
-- still run in the order they arrived.
redis.call('ZADD', P .. 'turns:live:' .. sid, redis.call('INCR', P .. 'turn:seq:' .. sid), tid)
-- A wake-up of an archived lineage is stored (its step meets the gate) but is not activity.
if not archived_in_lineage(sid) then touch(sid, ms, now) end
if state == 'running' then
  redis.call('SET', active_key, tid)
  return {'run'}
end
return {'queued'}
