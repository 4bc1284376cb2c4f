-- ARGV: prefix, sid
-- The step gate: one round trip whatever the lineage depth.
-- Returns 'ok' | 'missing' | 'deleted' | 'archived:<id of the archived session>'
local sid = ARGV[2]
local deleted = redis.call('HGET', skey(sid), 'deleted')
if not deleted then return 'missing' end
if deleted ~= '0' then return 'deleted' end
local holder = archived_in_lineage(sid)
if holder then return 'archived:' .. holder end
return 'ok'
