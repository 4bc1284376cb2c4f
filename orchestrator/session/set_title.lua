-- ARGV: prefix, sid, title (already normalized), source ('client'|'generated')
-- Writes title and titleSource; updatedAt is left alone (a title is not activity).
-- A generated title never replaces a client-set one: checked here, at write time, so a title
-- generated while the client renamed the session is discarded.
-- Returns 'ok' | 'not_found' | 'discarded'
local sid, title, source = ARGV[2], ARGV[3], ARGV[4]
local k = skey(sid)
-- A missing hash reads as false, which is not '0' either.
local h = redis.call('HMGET', k, 'deleted', 'titleSource')
if h[1] ~= '0' then return 'not_found' end
if source == 'generated' and h[2] == 'client' then return 'discarded' end
redis.call('HSET', k, 'title', title, 'titleSource', source)
return 'ok'
