-- ARGV: prefix, tid, state, stopReason, error, nowMs, nowIso, allowedFrom (comma list)
-- Returns {'finished', promotedTid|''} | {'noop', currentState}
local tid, state, reason, err = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ms, now, allowed = tonumber(ARGV[6]), ARGV[7], ARGV[8]
local st = redis.call('HGET', P .. 'turn:' .. tid, 'state')
if not st or not string.find(',' .. allowed .. ',', ',' .. st .. ',', 1, true) then
  return {'noop', st or 'missing'}
end
return {'finished', finish_turn(tid, state, reason, err, ms, now)}
