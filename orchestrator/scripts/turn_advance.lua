-- ARGV: prefix, tid, nextIndex. Moves a running turn to step nextIndex and drops the lease
-- (the same index re-offers the step: a worker that shuts down hands it on).
-- Returns 'ok' or the turn's state when it is no longer running.
local tid = ARGV[2]
local tk = P .. 'turn:' .. tid
local st = redis.call('HGET', tk, 'state')
redis.call('DEL', P .. 'turn:lease:' .. tid)
if st ~= 'running' then return st or 'missing' end
redis.call('HSET', tk, 'step', ARGV[3])
redis.call('ZADD', P .. 'turns:inflight', server_ms(), tid)
return 'ok'
