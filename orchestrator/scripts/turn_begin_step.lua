-- ARGV: prefix, tid, stepIndex, leaseMs
-- Claims a step for execution. Returns 'ok', 'stale' (a duplicate of a step already run),
-- 'inflight' (a duplicate of a step running now),
-- or the turn's state when it is no longer running.
local tid, index, lease_ms = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local tk = P .. 'turn:' .. tid
local h = redis.call('HMGET', tk, 'state', 'step')
if not h[1] then return 'missing' end
if h[1] ~= 'running' then return h[1] end
if tonumber(h[2]) ~= index then return 'stale' end
-- A redelivered copy of a step another worker is still running is dropped.
if redis.call('EXISTS', P .. 'turn:lease:' .. tid) == 1 then return 'inflight' end
redis.call('SET', P .. 'turn:lease:' .. tid, index, 'PX', lease_ms)
return 'ok'
