-- ARGV: prefix, nowMs, nowIso, sid, tid...
-- Cancels the named turns only (a late stop never touches a newer turn), and only those of
-- session sid (a turn of another session, or none, answers 'missing'). Queued turns end
-- 'cancelled' at once; a running turn with a step in flight becomes 'cancelling' and the step
-- settles it; a running turn between steps ends 'cancelled' at once.
-- Returns {flat, ended}: flat is tid, outcome, ... plus tid, 'promoted' for turns that started
-- running; ended lists the turns this call ended (a turn that had already ended answers its
-- state, 'cancelled' included, and is not in it: its end was announced by whoever ended it).
local ms, now = tonumber(ARGV[2]), ARGV[3]
local out, promoted, ended = {}, {}, {}
local running = {}
local sid = ARGV[4]
for i = 5, #ARGV do
  local tid = ARGV[i]
  local h = redis.call('HMGET', K.turn(tid), 'state', 'sessionId')
  local st = h[1]
  if h[2] ~= sid then
    out[#out + 1] = tid; out[#out + 1] = 'missing'
  elseif st == TURN.QUEUED then
    finish_turn(tid, TURN.CANCELLED, STOP_REASON[TURN.CANCELLED], '', ms, now)
    out[#out + 1] = tid; out[#out + 1] = TURN.CANCELLED
    ended[#ended + 1] = tid
  elseif st == TURN.RUNNING then
    running[#running + 1] = tid
  else
    out[#out + 1] = tid; out[#out + 1] = st or 'missing'
  end
end
for _, tid in ipairs(running) do
  if redis.call('EXISTS', K.step_lease(tid)) == 1 then
    redis.call('HSET', K.turn(tid), 'state', TURN.CANCELLING)
    out[#out + 1] = tid; out[#out + 1] = TURN.CANCELLING
  else
    local nxt = finish_turn(tid, TURN.CANCELLED, STOP_REASON[TURN.CANCELLED], '', ms, now)
    out[#out + 1] = tid; out[#out + 1] = TURN.CANCELLED
    ended[#ended + 1] = tid
    if nxt ~= '' then promoted[#promoted + 1] = nxt end
  end
end
for _, p in ipairs(promoted) do out[#out + 1] = p; out[#out + 1] = 'promoted' end
return {out, ended}
