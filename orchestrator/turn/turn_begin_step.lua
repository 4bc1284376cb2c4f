-- ARGV: prefix, tid, stepIndex, leaseMs, token
-- Asks the step gate and claims the step in one script, so no step is admitted once an
-- archive commits. Refused (gate_refusal): the turn ends here, 'blocked' (a 'cancelling' one
-- settles 'cancelled'). Admitted: the lease is set to this copy's fencing token, also kept
-- as the turn's stepToken (the copy that began last owns the step, see holds_step); the
-- model request is recorded (Keys.model_requests, at the server's time) and the turn's
-- progress scored (Keys.turns_inflight); step 0 records the prompt (user_message_chunk)
-- once, so a prompt that never ran never reads as said. A tool call an earlier copy left open
-- (its worker was lost, the sweeper resumed the step) is settled failed (settle_open_call).
-- What it writes to the conversation is published here (publish_update).
-- Returns {'ok', sessionId, prompt, source, title, model, agent} (what the step needs; the
--   session's title, model and agent are '' when unset) |
--   {'refused', reason, endedState, promotedTid|''} |
--   {'stale'} (a duplicate of a step already run) | {'inflight'} (a duplicate of a step
--   running now) | {state} (the turn is no longer running) | {'missing'}
local tid, index, lease_ms, token = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local tk = K.turn(tid)
local h = redis.call('HMGET', tk, 'state', 'step', 'sessionId', 'prompt', 'said', 'openCall',
  'source')
if not h[1] then return {'missing'} end
if h[1] ~= TURN.RUNNING and h[1] ~= TURN.QUEUED and h[1] ~= TURN.CANCELLING then return {h[1]} end
local sid = h[3]
local ms = server_ms()
local s = redis.call('HMGET', skey(sid), 'deleted', 'title', 'model', 'agent')
local refusal = gate_refusal(sid, s[1])
if refusal then
  local ended = (h[1] == TURN.CANCELLING) and TURN.CANCELLED or TURN.BLOCKED
  -- stopReason as turns.STOP_REASON (blocked and cancelled both read 'cancelled')
  local promoted = finish_turn(tid, ended, STOP_REASON[ended], 'gate: ' .. refusal, ms, iso_ms(ms))
  return {'refused', refusal, ended, promoted}
end
if h[1] ~= TURN.RUNNING then return {h[1]} end
if tonumber(h[2]) ~= index then return {'stale'} end
-- A redelivered copy of a step another worker is still running is dropped. A copy that began
-- before and whose lease lapsed is superseded from here on.
if not redis.call('SET', K.step_lease(tid), token, 'NX', 'PX', lease_ms) then
  return {'inflight'}
end
local said = index == 0 and h[5] ~= '1'
if said then
  redis.call('HSET', tk, 'stepToken', token, 'stepLeaseMs', lease_ms, 'said', '1')
else
  redis.call('HSET', tk, 'stepToken', token, 'stepLeaseMs', lease_ms)
end
local lost = settle_open_call(tid, sid, CALL.FAILED,
  'no result: the copy of the step that made this call was lost (its worker stopped); '
  .. 'the step runs again', h[6])
if lost ~= '' then publish_update(sid, lost) end
redis.call('RPUSH', K.model_requests(sid),
  cjson.encode({turnId = tid, step = index, at = iso_ms(ms)}))
redis.call('ZADD', K.turns_inflight, ms, tid)
if said then
  local prompt = cjson.encode({sessionUpdate = 'user_message_chunk', turnId = tid,
    content = {type = 'text', text = h[4] or ''}})
  redis.call('RPUSH', K.history(sid), prompt)
  publish_update(sid, prompt)
end
return {'ok', sid, h[4] or '', h[7] or '', s[2] or '', s[3] or '', s[4] or ''}
