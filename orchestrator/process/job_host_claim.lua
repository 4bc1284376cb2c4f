-- ARGV: prefix, host, instance, pid, leaseMs
-- A job worker takes, or renews, the lease on its host name (Keys.job_host): stops are
-- routed by host name, so one live worker per name. Taken when free (or lapsed), renewed when
-- held by the same instance, refused when another instance holds it.
-- Returns {'ok'} | {'held', holderInstance, holderPid, holderSince}
local k = K.job_host(ARGV[2])
local h = redis.call('HMGET', k, 'instance', 'pid', 'since')
if h[1] and h[1] ~= ARGV[3] then return {'held', h[1], h[2] or '', h[3] or ''} end
if not h[1] then
  redis.call('HSET', k, 'instance', ARGV[3], 'pid', ARGV[4], 'since', iso_ms(server_ms()))
end
redis.call('PEXPIRE', k, ARGV[5])
return {'ok'}
