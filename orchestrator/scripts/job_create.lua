-- ARGV: prefix, jid, sid, label, seconds, nowIso, startTimeoutMs, guardTid|''
-- Stores a starting job, unless the turn whose step asks for it (guardTid) no longer runs.
-- Returns 'ok' | 'stopped'
local jid, sid = ARGV[2], ARGV[3]
if not turn_runs(ARGV[8]) then return 'stopped' end
redis.call('HSET', P .. 'job:' .. jid, 'jobId', jid, 'sessionId', sid, 'label', ARGV[4],
  'seconds', ARGV[5], 'state', 'starting', 'host', '', 'pid', '', 'createdAt', ARGV[6],
  'startedAt', '', 'endedAt', '', 'exitCode', '')
redis.call('SADD', P .. 'jobs:live:' .. sid, jid)
redis.call('SET', P .. 'job:lease:' .. jid, 'starting', 'PX', ARGV[7])
return 'ok'
