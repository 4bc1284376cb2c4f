-- ARGV: prefix, sid, nowIso, checkLive '0'|'1'
-- Marks the session deleted and drops it from every index. With checkLive the delete is
-- refused when the session or a descendant has live work (the census's rule, has_live in
-- _lib.lua), so the check and the write are one step and no work is hidden by a delete.
-- Returns 'deleted' | 'missing' | 'active'
local sid = ARGV[2]
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then return 'missing' end
if ARGV[4] == '1' then
  for _, s in ipairs(subtree(sid)) do
    if has_live(s) then return 'active' end
  end
end
local h = redis.call('HMGET', k, 'cwdHash')
redis.call('HSET', k, 'deleted', '1', 'deletedAt', ARGV[3])
redis.call('SREM', K.archived, sid)
for _, st in ipairs({'all', 'active', 'archived'}) do
  redis.call('ZREM', idx(st), sid)
  redis.call('ZREM', idx(st, h[1]), sid)
end
return 'deleted'
