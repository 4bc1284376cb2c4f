-- ARGV: prefix, tid, nextIndex, token
-- Moves a running turn to step nextIndex and drops the lease (the same index re-offers the
-- step: a worker that shuts down hands it on), only for the copy of the step that owns it
-- (holds_step): a superseded copy neither advances the turn nor drops the lease of the copy
-- that superseded it.
-- Returns 'ok' | 'superseded' | the turn's state when it is no longer running.
local tid, token = ARGV[2], ARGV[4] or ''
local tk = K.turn(tid)
local st = redis.call('HGET', tk, 'state')
if (st == 'running' or st == 'cancelling') and not holds_step(tid, token) then
  return 'superseded'
end
redis.call('DEL', K.step_lease(tid))
if st ~= 'running' then return st or 'missing' end
-- The step is done with: no late poll of this copy may re-take a lease for the next one.
redis.call('HDEL', tk, 'stepToken')
redis.call('HSET', tk, 'step', ARGV[3])
redis.call('ZADD', K.turns_inflight, server_ms(), tid)
return 'ok'
