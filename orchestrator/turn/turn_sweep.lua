-- ARGV: prefix, tid, stuckMs, maxResumes, failedStopReason, cancelledStopReason,
--   seen, seenStep, seenTag: what turn_broker_scan.lua found of the step's message just
--   before ('queued', 'held' with its delivery tag, 'unseen', 'absent'; '' when not looked)
-- The sweeper's decision for one member of turns:inflight, read and written in one step on
-- Redis's clock (TIME), so sweepers on several workers never act twice on the same loss: a
-- resume re-scores the member, and the next sweeper finds it fresh.
--   * a member whose turn is not running or cancelling (ended, queued, missing) is removed;
--   * a member with progress within stuckMs, or whose step holds its lease, is left alone;
--   * a running turn whose step holds no lease but whose message the broker still holds is
--     left alone ('waiting'): queued behind busy workers, or beyond the scan's bound; or
--     taken by a worker that has not begun it: the first pass that sees that delivery notes
--     it on the turn (heldTag, heldMs), and once it was held stuckMs without the step
--     beginning, its worker is taken for dead (a live one begins a step it took at once: it
--     takes one only with a thread free) and the step is lost. A held step that began
--     (stepToken, cleared when the turn advances) and lost its lease is lost at once: the
--     copy that began it died or froze (a held message is most likely its own);
--   * a running turn whose step is lost (no lease, no message) is resumed: the caller
--     dispatches its current step again (a duplicate copy is dropped by turn_begin_step).
--     Losses of the same step are counted on the turn (resumes, resumeStep); past
--     maxResumes it ends 'failed';
--   * a cancelling turn whose step holds no lease ends 'cancelled', wherever its message is
--     (a copy that reaches a worker later settles nothing: turn_begin_step drops it).
-- A turn ending here settles the tool call its lost step left open (settle_open_call):
-- 'failed', or 'cancelled' for a cancelling one, never in an archived lineage.
-- Returns {'gone'} | {'removed', state} | {'fresh'} | {'leased'} | {'waiting', seen}
--   | {'resume', sid, step, losses}
--   | {'failed', sid, promotedTid|'', losses, error, wroteHistory '0'|'1', settlement|''}
--   | {'cancelled', sid, promotedTid|'', settlement|''}
local tid, stuck_ms, max_resumes = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local failed_reason, cancelled_reason = ARGV[5], ARGV[6]
local seen, seen_step, seen_tag = ARGV[7] or '', ARGV[8] or '', ARGV[9] or ''
local inflight = K.turns_inflight
local tk = K.turn(tid)

local score = redis.call('ZSCORE', inflight, tid)
if not score then return {'gone'} end
local h = redis.call('HMGET', tk, 'state', 'step', 'sessionId', 'resumes', 'resumeStep',
  'heldTag', 'heldMs', 'stepToken')
local state = h[1]
if state ~= TURN.RUNNING and state ~= TURN.CANCELLING then
  redis.call('ZREM', inflight, tid)
  return {'removed', state or 'missing'}
end
local now = server_ms()
if now - tonumber(score) < stuck_ms then return {'fresh'} end
if redis.call('EXISTS', K.step_lease(tid)) == 1 then return {'leased'} end
local sid, step = h[3], h[2] or '0'

if state == TURN.CANCELLING then
  -- The step that was to settle the stop is gone (its worker died, or its redelivered copy
  -- was refused): settle it here, as the step would have.
  local settled = ''
  if not archived_in_lineage(sid) then
    settled = settle_open_call(tid, sid, CALL.CANCELLED, 'cancelled: its step was lost')
  end
  local nxt = finish_turn(tid, TURN.CANCELLED, cancelled_reason, '', now, iso_ms(now))
  redis.call('ZREM', inflight, tid)
  return {TURN.CANCELLED, sid, nxt, settled}
end

if seen ~= '' then
  -- The turn moved on since the scan (it would be fresh): look again next pass.
  if seen_step ~= step then return {'fresh'} end
  local held_for = -1
  if seen == 'held' and h[8] then
    held_for = stuck_ms -- the step began (stepToken) and its lease lapsed: its worker is gone
  elseif seen == 'held' and h[6] == seen_tag then
    held_for = now - (tonumber(h[7]) or now)
  end
  if seen == 'held' and held_for < 0 then
    redis.call('HSET', tk, 'heldTag', seen_tag, 'heldMs', now)
  elseif h[6] and (seen ~= 'held' or held_for >= stuck_ms) then
    redis.call('HDEL', tk, 'heldTag', 'heldMs')
  end
  if seen == 'queued' or seen == 'unseen' or (seen == 'held' and held_for < stuck_ms) then
    return {'waiting', seen}
  end
end

-- Losses are counted per step: a turn that moved on since the last loss starts again at 0.
local losses = 1
if h[5] == step then losses = (tonumber(h[4]) or 0) + 1 end
if losses > max_resumes then
  local err = 'step ' .. step .. ' lost ' .. losses .. ' times (its worker died or its '
    .. 'message was lost; resumed ' .. max_resumes .. ' times)'
  local wrote, settled = '0', ''
  -- The error is the turn's last message, as for a model failure; never in an archived
  -- lineage's conversation, which stays as its archive left it.
  if not archived_in_lineage(sid) then
    settled = settle_open_call(tid, sid, CALL.FAILED, 'no result: ' .. err)
    redis.call('RPUSH', K.history(sid), cjson.encode({
      sessionUpdate = 'agent_message_chunk', turnId = tid,
      content = {type = 'text', text = 'error: ' .. err}}))
    wrote = '1'
  end
  redis.call('HSET', tk, 'resumes', losses, 'resumeStep', step)
  local nxt = finish_turn(tid, TURN.FAILED, failed_reason, err, now, iso_ms(now))
  redis.call('ZREM', inflight, tid)
  return {TURN.FAILED, sid, nxt, losses, err, wrote, settled}
end
redis.call('HSET', tk, 'resumes', losses, 'resumeStep', step)
redis.call('ZADD', inflight, now, tid)
return {'resume', sid, step, losses}
