-- ARGV: prefix, jid, sid, label, seconds, nowIso, startTimeoutMs
local jid, sid = ARGV[2], ARGV[3]
redis.call('HSET', P .. 'job:' .. jid, 'jobId', jid, 'sessionId', sid, 'label', ARGV[4],
  'seconds', ARGV[5], 'state', 'starting', 'host', '', 'pid', '', 'createdAt', ARGV[6],
  'startedAt', '', 'endedAt', '', 'exitCode', '')
redis.call('SADD', P .. 'jobs:live:' .. sid, jid)
redis.call('SET', P .. 'job:lease:' .. jid, 'starting', 'PX', ARGV[7])
return 'ok'
