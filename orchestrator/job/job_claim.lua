-- ARGV: prefix, jid, host, leaseMs, nowIso, instance, maxJobsPerHost, limitTemplate
-- A job worker takes a starting job. Refused (and ended) when the session's lineage is
-- archived, so a start request that outlived an archive starts nothing; or when host already
-- runs maxJobsPerHost live jobs (FLEET_MAX_JOBS_PER_HOST; counted here, with the claim), its
-- reason then being limitTemplate with the count for its %d. The claiming worker's instance
-- is recorded with its host: a stop verifies it before signalling anything.
-- Returns 'ok' | 'refused:<holder>' | 'refused:<limit message>' | the job's state when it is
-- not starting
local jid, host, lease_ms, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jk = K.job(jid)
local h = redis.call('HMGET', jk, 'state', 'sessionId')
if not h[1] then return 'missing' end
if h[1] ~= JOB.STARTING then return h[1] end
local reason, answer = false, false
local holder = archived_in_lineage(h[2])
if holder or redis.call('HGET', skey(h[2]), 'deleted') ~= '0' then
  answer = holder or h[2]
  reason = 'archived:' .. answer
else
  local hk = K.host_jobs(host)
  local live = 0
  for _, j in ipairs(redis.call('SMEMBERS', hk)) do
    if job_live(j) then live = live + 1 else redis.call('SREM', hk, j) end
  end
  if live >= tonumber(ARGV[7]) then
    reason = string.format(ARGV[8], live)
    answer = reason
  end
end
if reason then
  redis.call('HSET', jk, 'state', JOB.REFUSED, 'endedAt', now, 'reason', reason)
  redis.call('SREM', K.live_jobs(h[2]), jid)
  sync_busy(h[2])
  redis.call('DEL', K.job_lease(jid))
  return 'refused:' .. answer
end
redis.call('HSET', jk, 'state', JOB.RUNNING, 'host', host, 'instance', ARGV[6] or '', 'startedAt', now)
redis.call('SET', K.job_lease(jid), host, 'PX', lease_ms)
redis.call('SADD', K.host_jobs(host), jid)
return 'ok'
