-- ARGV: prefix, tid, state, stopReason, error, nowMs|'', nowIso|'', allowedFrom (comma list),
--   token|'', streamMax|'', update|''
-- With token (a step ends its own turn: completed, failed, or the cancel it settles) only the
-- copy of the step that owns it may (holds_step); a superseded copy ends nothing. Without
-- (a stop, the census settling a 'cancelling' turn) it acts on the turn alone. nowMs '' reads
-- the server's clock here. With update (the JSON of the step's last words, landed with the
-- end) the update is appended to the conversation first, as turn_record would, and
-- published. With streamMax the turn's end is published here (emit_event: the 'turn' event
-- turns.announce_end describes, the event stream capped near streamMax entries).
-- Returns {'finished', promotedTid|''} ({'finished', promotedTid|'', sessionId} with
--   streamMax) | {'noop', currentState} | {'superseded'}
local tid, state, reason, err = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local allowed, token, stream_max = ARGV[8], ARGV[9] or '', ARGV[10] or ''
local h = redis.call('HMGET', K.turn(tid), 'state', 'sessionId', 'heldTag')
local st = h[1]
if not st or not string.find(',' .. allowed .. ',', ',' .. st .. ',', 1, true) then
  return {'noop', st or 'missing'}
end
if token ~= '' and not holds_step(tid, token) then return {'superseded'} end
local sid, update = h[2], ARGV[11] or ''
if update ~= '' and st == TURN.RUNNING then append_update(tid, sid, update) end
local ms = tonumber(ARGV[6]) or server_ms()
local now = (ARGV[7] or '') ~= '' and ARGV[7] or iso_ms(ms)
local promoted = finish_turn(tid, state, reason, err, ms, now, false, {sid = sid, held = h[3]})
if stream_max ~= '' then
  -- stopReason null for a failed turn, as turns.Turn.to_wire writes it
  local stop = state == TURN.FAILED and 'null' or ('"' .. reason .. '"')
  emit_event(event_turn_end(sid, tid, state, stop), stream_max)
  return {'finished', promoted, sid}
end
return {'finished', promoted}
