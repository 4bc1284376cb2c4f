-- ARGV: prefix, tid, state, stopReason, error, nowMs, nowIso, allowedFrom (comma list),
--   token|''
-- With token (a step ends its own turn: completed, failed, or the cancel it settles) only the
-- copy of the step that owns it may (holds_step); a superseded copy ends nothing. Without
-- (a stop, the census settling a 'cancelling' turn) it acts on the turn alone.
-- Returns {'finished', promotedTid|''} | {'noop', currentState} | {'superseded'}
local tid, state, reason, err = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ms, now, allowed, token = tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9] or ''
local st = redis.call('HGET', K.turn(tid), 'state')
if not st or not string.find(',' .. allowed .. ',', ',' .. st .. ',', 1, true) then
  return {'noop', st or 'missing'}
end
if token ~= '' and not holds_step(tid, token) then return {'superseded'} end
return {'finished', finish_turn(tid, state, reason, err, ms, now)}
