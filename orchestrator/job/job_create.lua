-- ARGV: prefix, jid, sid, label, seconds, nowIso, startTimeoutMs, guardTid|'', guardToken|'',
--       maxJobs, command|''
-- Stores a starting job, unless the turn whose step asks for it (guardTid) no longer runs or
-- that copy of the step (guardToken) no longer owns it (step_owns), or the session already
-- has maxJobs live jobs (FLEET_MAX_JOBS_PER_SESSION; counted here, with the insert).
-- Returns 'ok' | 'stopped' | 'limit:<live jobs>'
local jid, sid = ARGV[2], ARGV[3]
if not step_owns(ARGV[8], ARGV[9]) then return 'stopped' end
local live = count_live_jobs(K.live_jobs(sid))
if live >= tonumber(ARGV[10]) then return 'limit:' .. live end
redis.call('HSET', K.job(jid), 'jobId', jid, 'sessionId', sid, 'label', ARGV[4],
  'seconds', ARGV[5], 'state', JOB.STARTING, 'host', '', 'instance', '', 'pid', '', 'pidStart', '',
  'createdAt', ARGV[6], 'startedAt', '', 'endedAt', '', 'exitCode', '', 'command', ARGV[11] or '')
redis.call('SADD', K.live_jobs(sid), jid)
sync_busy(sid)
redis.call('SET', K.job_lease(jid), JOB.STARTING, 'PX', ARGV[7])
return 'ok'
