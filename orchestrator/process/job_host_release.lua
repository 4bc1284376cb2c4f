-- ARGV: prefix, host, instance
-- A job worker leaving gives its host name back (only if it still holds it).
-- Returns 1 when released, 0 when another instance holds it or nobody does
local k = K.job_host(ARGV[2])
if redis.call('HGET', k, 'instance') ~= ARGV[3] then return 0 end
redis.call('DEL', k)
return 1
