-- ARGV: prefix, tid, stepIndex, leaseMs, token
-- Asks the step gate and claims the step in one script, so no step is admitted once an
-- archive commits. Refused (gate_refusal): the turn ends here, 'blocked' (a 'cancelling' one
-- settles 'cancelled'). Admitted: the lease is set to this copy's fencing token, also kept
-- as the turn's stepToken (the copy that began last owns the step, see holds_step); the
-- model request is recorded (Keys.model_requests, at the server's time) and the turn's
-- progress scored (Keys.turns_inflight); step 0 records the prompt (user_message_chunk)
-- once, so a prompt that never ran never reads as said. A tool call an earlier copy left open
-- (its worker was lost, the sweeper resumed the step) is settled failed (settle_open_call).
-- Returns {'ok', promptUpdateJson|'', settlementJson|''} | {'refused', reason, endedState, promotedTid|''} |
--   {'stale'} (a duplicate of a step already run) | {'inflight'} (a duplicate of a step
--   running now) | {state} (the turn is no longer running) | {'missing'}
local tid, index, lease_ms, token = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local tk = K.turn(tid)
local h = redis.call('HMGET', tk, 'state', 'step', 'sessionId', 'prompt', 'said')
if not h[1] then return {'missing'} end
if h[1] ~= 'running' and h[1] ~= 'queued' and h[1] ~= 'cancelling' then return {h[1]} end
local ms = server_ms()
local refusal = gate_refusal(h[3])
if refusal then
  local ended = (h[1] == 'cancelling') and 'cancelled' or 'blocked'
  -- stopReason as turns.STOP_REASON (blocked and cancelled both read 'cancelled')
  local promoted = finish_turn(tid, ended, 'cancelled', 'gate: ' .. refusal, ms, iso_ms(ms))
  return {'refused', refusal, ended, promoted}
end
if h[1] ~= 'running' then return {h[1]} end
if tonumber(h[2]) ~= index then return {'stale'} end
-- A redelivered copy of a step another worker is still running is dropped.
if redis.call('EXISTS', K.step_lease(tid)) == 1 then return {'inflight'} end
-- A copy that began before and whose lease lapsed is superseded from here on.
redis.call('SET', K.step_lease(tid), token, 'PX', lease_ms)
redis.call('HSET', tk, 'stepToken', token, 'stepLeaseMs', lease_ms)
local lost = settle_open_call(tid, h[3], 'failed',
  'no result: the copy of the step that made this call was lost (its worker stopped); '
  .. 'the step runs again')
redis.call('RPUSH', K.model_requests(h[3]),
  cjson.encode({turnId = tid, step = index, at = iso_ms(ms)}))
redis.call('ZADD', K.turns_inflight, ms, tid)
local said = ''
if index == 0 and h[5] ~= '1' then
  said = cjson.encode({sessionUpdate = 'user_message_chunk', turnId = tid,
    content = {type = 'text', text = h[4] or ''}})
  redis.call('RPUSH', K.history(h[3]), said)
  redis.call('HSET', tk, 'said', '1')
end
return {'ok', said, lost}
