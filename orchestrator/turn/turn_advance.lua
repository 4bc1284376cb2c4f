-- ARGV: prefix, tid, nextIndex, token, update|''
-- Moves a running turn to step nextIndex and drops the lease (the same index re-offers the
-- step: a worker that shuts down hands it on), only for the copy of the step that owns it
-- (holds_step): a superseded copy neither advances the turn nor drops the lease of the copy
-- that superseded it. With update (the JSON of the step's last words, landed with the
-- advance) the update is appended to the conversation first, as turn_record would, and
-- published.
-- Returns 'ok' | 'superseded' | the turn's state when it is no longer running.
local tid, token, update = ARGV[2], ARGV[4] or '', ARGV[5] or ''
local tk = K.turn(tid)
local h = redis.call('HMGET', tk, 'state', 'sessionId')
local st = h[1]
if (st == TURN.RUNNING or st == TURN.CANCELLING) and not holds_step(tid, token) then
  return 'superseded'
end
redis.call('DEL', K.step_lease(tid))
if st ~= TURN.RUNNING then return st or 'missing' end
if update ~= '' then append_update(tid, h[2], update) end
-- The step is done with: no late poll of this copy may re-take a lease for the next one.
redis.call('HDEL', tk, 'stepToken')
redis.call('HSET', tk, 'step', ARGV[3])
redis.call('ZADD', K.turns_inflight, server_ms(), tid)
return 'ok'
