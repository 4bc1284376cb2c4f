-- ARGV: prefix, tid, updateJson, settle '0'|'1', token|''
-- Appends a session/update of a turn's step to its session's conversation only while the
-- turn runs and that copy of the step (token) still owns it (holds_step), so nothing a
-- stopped or superseded step does lands. With settle (an in-flight tool call settling as
-- cancelled), a 'cancelling' turn may still write, unless the gate refuses its session
-- (never into an archived session). token '' is a write no step makes (the state alone).
-- The turn's open tool call is noted (note_open_call) so an archive can settle it, and the
-- update is published (publish_update).
-- Returns 1 when appended, 0 when the turn stopped, -1 when the copy is superseded.
local tid, settle, token = ARGV[2], ARGV[4] == '1', ARGV[5] or ''
local h = redis.call('HMGET', K.turn(tid), 'state', 'sessionId')
if h[1] ~= TURN.RUNNING then
  if not (settle and h[1] == TURN.CANCELLING and not gate_refusal(h[2])) then return 0 end
end
if token ~= '' and not holds_step(tid, token) then return -1 end
append_update(tid, h[2], ARGV[3])
return 1
