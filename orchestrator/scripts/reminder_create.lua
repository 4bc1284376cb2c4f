-- ARGV: prefix, rid, sid, prompt, label, dueMs, dueIso, nowIso, guardTid|''
-- Arms a reminder, unless the turn whose step asks for it (guardTid) no longer runs.
-- Returns 'ok' | 'stopped'
local rid, sid = ARGV[2], ARGV[3]
if not turn_runs(ARGV[9]) then return 'stopped' end
redis.call('HSET', P .. 'reminder:' .. rid, 'reminderId', rid, 'sessionId', sid,
  'prompt', ARGV[4], 'label', ARGV[5], 'dueAt', ARGV[7], 'createdAt', ARGV[8], 'state', 'armed')
redis.call('ZADD', P .. 'reminders:due', ARGV[6], rid)
redis.call('SADD', P .. 'reminders:live:' .. sid, rid)
return 'ok'
