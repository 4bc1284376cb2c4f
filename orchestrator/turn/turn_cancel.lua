-- ARGV: prefix, nowMs, nowIso, sid, tid...
-- Cancels the named turns only (a late stop never touches a newer turn), and only those of
-- session sid (a turn of another session, or none, answers 'missing'), each by the cancel
-- rule (cancel_turn in _lib.lua): queued ones first, so none of them is promoted when a
-- running one named with them ends.
-- Returns {flat, ended}: flat is tid, outcome, ... plus tid, 'promoted' for turns that started
-- running; ended lists the turns this call ended (a turn that had already ended answers its
-- state, cancelled included, and is not in it: its end was announced by whoever ended it).
local ms, now = tonumber(ARGV[2]), ARGV[3]
local out, promoted, ended = {}, {}, {}
local running = {}
local sid = ARGV[4]
local function cancel(tid, st)
  local to, nxt = cancel_turn(tid, st, ms, now, nil, '', false)
  out[#out + 1] = tid; out[#out + 1] = to
  if to == TURN.CANCELLED then ended[#ended + 1] = tid end
  if nxt ~= '' then promoted[#promoted + 1] = nxt end
end
for i = 5, #ARGV do
  local tid = ARGV[i]
  local h = redis.call('HMGET', K.turn(tid), 'state', 'sessionId')
  local st = h[1]
  if h[2] ~= sid then
    out[#out + 1] = tid; out[#out + 1] = 'missing'
  elseif st == TURN.QUEUED then
    cancel(tid, st)
  elseif st == TURN.RUNNING then
    running[#running + 1] = tid
  else
    out[#out + 1] = tid; out[#out + 1] = st or 'missing'
  end
end
for _, tid in ipairs(running) do cancel(tid, TURN.RUNNING) end
for _, p in ipairs(promoted) do out[#out + 1] = p; out[#out + 1] = 'promoted' end
return {out, ended}
