-- ARGV: prefix, jid, host, leaseMs, nowIso, instance
-- A job worker takes a starting job. Refused (and ended) when the session's lineage is
-- archived, so a start request that outlived an archive starts nothing. The claiming worker's
-- instance is recorded with its host: a stop verifies it before signalling anything.
-- Returns 'ok' | 'refused:<holder>' | the job's state when it is not starting
local jid, host, lease_ms, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jk = P .. 'job:' .. jid
local h = redis.call('HMGET', jk, 'state', 'sessionId')
if not h[1] then return 'missing' end
if h[1] ~= 'starting' then return h[1] end
local holder = archived_in_lineage(h[2])
if holder or redis.call('HGET', skey(h[2]), 'deleted') ~= '0' then
  redis.call('HSET', jk, 'state', 'refused', 'endedAt', now)
  redis.call('SREM', P .. 'jobs:live:' .. h[2], jid)
  redis.call('DEL', P .. 'job:lease:' .. jid)
  return 'refused:' .. (holder or h[2])
end
redis.call('HSET', jk, 'state', 'running', 'host', host, 'instance', ARGV[6] or '', 'startedAt', now)
redis.call('SET', P .. 'job:lease:' .. jid, host, 'PX', lease_ms)
return 'ok'
