-- ARGV: prefix, jid, state, exitCode, nowIso, allowedFrom (comma list), reason (optional:
-- why it ended so, e.g. the job watchdog's kill, orchestrator/job/jobwatch.py)
-- Returns 'ok' | the job's state when it was not in allowedFrom
local jid, state = ARGV[2], ARGV[3]
local jk = K.job(jid)
local h = redis.call('HMGET', jk, 'state', 'sessionId', 'host')
if not h[1] then return 'missing' end
if not string.find(',' .. ARGV[6] .. ',', ',' .. h[1] .. ',', 1, true) then return h[1] end
redis.call('HSET', jk, 'state', state, 'exitCode', ARGV[4], 'endedAt', ARGV[5])
if ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', jk, 'reason', ARGV[7]) end
redis.call('SREM', K.live_jobs(h[2]), jid)
sync_busy(h[2])
redis.call('DEL', K.job_lease(jid))
if h[3] and h[3] ~= '' then redis.call('SREM', K.host_jobs(h[3]), jid) end
return 'ok'
