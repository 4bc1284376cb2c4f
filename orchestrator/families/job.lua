-- The job family's liveness rule: starting or running under a lease (a job whose worker
-- vanished stops counting once the lease lapses: 'stale').
local function job_verdict(jid)
  local st = redis.call('HGET', K.job(jid), 'state')
  if st ~= JOB.STARTING and st ~= JOB.RUNNING then return false end
  return redis.call('EXISTS', K.job_lease(jid)) == 1 and 'live' or 'stale'
end

local function job_live(jid) return job_verdict(jid) == 'live' end

-- How many members of the job-id set key count as live (job_live).
local function count_live_jobs(key)
  local n = 0
  for _, j in ipairs(redis.call('SMEMBERS', key)) do
    if job_live(j) then n = n + 1 end
  end
  return n
end

family('job', {
  key = K.live_jobs,
  ids = function(sid) return sorted_members(K.live_jobs(sid)) end,
  verdict = job_verdict, hash = K.job, fields = {'label', 'host', 'pid'},
})
