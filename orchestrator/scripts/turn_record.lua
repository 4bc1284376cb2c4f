-- ARGV: prefix, tid, updateJson, settle '0'|'1'
-- Appends a session/update of a turn's step to its session's conversation only while the
-- turn runs, so nothing a stopped or archived turn's step does lands after the stop. With
-- settle (an in-flight tool call settling as cancelled), a 'cancelling' turn may still
-- write, unless the gate refuses its session (never into an archived session).
-- Returns 1 when appended, else 0.
local tid, settle = ARGV[2], ARGV[4] == '1'
local h = redis.call('HMGET', P .. 'turn:' .. tid, 'state', 'sessionId')
if h[1] ~= 'running' then
  if not (settle and h[1] == 'cancelling' and not gate_refusal(h[2])) then return 0 end
end
redis.call('RPUSH', P .. 'history:' .. h[2], ARGV[3])
return 1
