-- ARGV: prefix, jid, instance, leaseMs
-- The owning worker renews a running job's lease (orchestrator/jobs.py, every quarter lease),
-- only while the job is still running, claimed by this worker instance, and its lease has
-- not lapsed: a lapsed lease means the job counts as lost (the census may have recorded it
-- so already), and a worker that resumes from a freeze must kill it, never revive it.
-- Returns 'ok' | 'lapsed' (running, lease gone) | 'other' (claimed by another instance) |
-- the job's state when it is not running | 'missing'
local jid = ARGV[2]
local h = redis.call('HMGET', K.job(jid), 'state', 'instance')
if not h[1] then return 'missing' end
if h[1] ~= 'running' then return h[1] end
if h[2] ~= ARGV[3] then return 'other' end
if redis.call('PEXPIRE', K.job_lease(jid), ARGV[4]) == 0 then return 'lapsed' end
return 'ok'
