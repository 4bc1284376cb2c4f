-- ARGV: prefix, sid, nowIso. Marks the session deleted and drops it from every index.
-- Returns 'deleted' | 'missing'
local sid = ARGV[2]
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then return 'missing' end
local h = redis.call('HMGET', k, 'cwdHash')
redis.call('HSET', k, 'deleted', '1', 'deletedAt', ARGV[3])
redis.call('SREM', P .. 'archived', sid)
for _, st in ipairs({'all', 'active', 'archived'}) do
  redis.call('ZREM', idx(st), sid)
  redis.call('ZREM', idx(st, h[1]), sid)
end
return 'deleted'
