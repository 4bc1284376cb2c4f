-- ARGV: prefix, sid, stopActivity '0'|'1', nowIso, txn
-- Checks for live work (unless stopActivity) and writes the archive for the session and its
-- whole subtree in one step, so no work can start unseen between the check and the write.
-- Returns {'not_found'} | {'already'} | {'active'} | {'archived', n}
local sid, stop, now, txn = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local k = skey(sid)
if redis.call('EXISTS', k) == 0 or redis.call('HGET', k, 'deleted') ~= '0' then
  return {'not_found'}
end
if redis.call('HGET', k, 'archived') == '1' then return {'already'} end
local nodes = subtree(sid)
if stop ~= '1' then
  for _, s in ipairs(nodes) do
    if has_live(s) then return {'active'} end
  end
end
local n = 0
for _, s in ipairs(nodes) do
  if redis.call('HGET', skey(s), 'archived') ~= '1' then
    redis.call('HSET', skey(s), 'archived', '1', 'archivedAt', now, 'archiveTxn', txn)
    redis.call('SADD', P .. 'archived', s)
    move_index(s, 'active', 'archived')
    n = n + 1
  end
end
return {'archived', n}
