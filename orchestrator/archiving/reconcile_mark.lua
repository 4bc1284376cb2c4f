-- ARGV: prefix, sid, txn, op ('attempt'|'clear'), nextMs, maxAttempts, sinceIso, familiesJson
-- Reconciler bookkeeping on an archived session, for its archive transition txn only (a
-- session unarchived, or archived again since the census, is left alone: 'stale').
-- 'attempt': one more stop re-dispatch is counted (reconcileAttempts, for reconcileTxn) and
-- the next run may retry at nextMs; reaching maxAttempts writes archiveHazard (JSON {since,
-- attempts, families}) once. Returns {'attempt'|'hazard', attempts}.
-- 'clear': the census found it quiet; attempts and hazard are removed. Returns
-- {'cleared', hadHazard ('1'|'0')} or {'none'} when there was nothing to clear.
local sid, txn, op = ARGV[2], ARGV[3], ARGV[4]
local k = skey(sid)
local h = redis.call('HMGET', k, 'archived', 'archiveTxn', 'reconcileTxn', 'reconcileAttempts',
  'archiveHazard', 'deleted')
if h[1] ~= '1' or h[2] ~= txn or h[6] == '1' then return {'stale'} end
local hazard = h[5] and h[5] ~= ''
if op == 'clear' then
  if not h[3] and not hazard then return {'none'} end
  redis.call('HDEL', k, 'reconcileTxn', 'reconcileAttempts', 'reconcileNextMs', 'archiveHazard')
  return {'cleared', hazard and '1' or '0'}
end
local attempts = 0
if h[3] == txn then attempts = tonumber(h[4] or '0') or 0 else hazard = false end
attempts = attempts + 1
redis.call('HSET', k, 'reconcileTxn', txn, 'reconcileAttempts', attempts, 'reconcileNextMs',
  ARGV[5])
if attempts >= tonumber(ARGV[6]) then
  local since = ARGV[7]
  if hazard then since = cjson.decode(h[5]).since or since end
  local doc = cjson.encode({since = since, attempts = attempts,
    families = cjson.decode(ARGV[8])})
  redis.call('HSET', k, 'archiveHazard', doc)
  if not hazard then return {'hazard', attempts} end
end
return {'attempt', attempts}
