-- ARGV: prefix, jid, instance, leaseMs[, pid, pidStart]
-- The owning worker renews a running job's lease (orchestrator/job/jobsupervisor.py, every quarter lease),
-- only while the job is still running, claimed by this worker instance, and its lease has
-- not lapsed: a lapsed lease means the job counts as lost (the census may have recorded it
-- so already), and a worker that resumes from a freeze must kill it, never revive it.
-- With pid and pidStart, the job watchdog (orchestrator/job/jobwatch.py) asks to resume a job it
-- froze while Redis did not answer: the lease is taken again even if it lapsed meanwhile (a
-- frozen tree does no work, so the census not counting it hid none), but only while the job
-- is still running, this instance's, the recorded process is that one, and neither the
-- session nor an ancestor is archived or deleted (as job_claim.lua asks); otherwise nothing
-- is written and the watchdog kills the tree.
-- Returns 'ok' | 'revived' (lapsed, taken again) | 'lapsed' (running, lease gone) |
-- 'other' (claimed by another instance or process) | 'archived:<holder>' | the job's state
-- when it is not running | 'missing'
local jid = ARGV[2]
local h = redis.call('HMGET', K.job(jid), 'state', 'instance', 'sessionId', 'pid', 'pidStart')
if not h[1] then return 'missing' end
if h[1] ~= JOB.RUNNING then return h[1] end
if h[2] ~= ARGV[3] then return 'other' end
local resume = ARGV[5] ~= nil and ARGV[5] ~= ''
if resume then
  if h[4] ~= ARGV[5] or (h[5] or '') ~= (ARGV[6] or '') then return 'other' end
  local holder = archived_in_lineage(h[3])
  if holder then return 'archived:' .. holder end
  if redis.call('HGET', skey(h[3]), 'deleted') ~= '0' then return 'archived:' .. h[3] end
end
if redis.call('PEXPIRE', K.job_lease(jid), ARGV[4]) == 1 then return 'ok' end
if not resume then return 'lapsed' end
local host = redis.call('HGET', K.job(jid), 'host')
redis.call('SET', K.job_lease(jid), host or '', 'PX', ARGV[4])
if host and host ~= '' then redis.call('SADD', K.host_jobs(host), jid) end
redis.call('SADD', K.live_jobs(h[3]), jid)
sync_busy(h[3])
return 'revived'
