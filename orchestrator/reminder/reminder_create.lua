-- ARGV: prefix, rid, sid, prompt, label, delayMs, dueIso, nowIso, guardTid|'', guardToken|'',
--       maxReminders
-- Arms a reminder due delayMs after now on the server's clock (TIME), the clock the claim
-- (reminder_claim.lua) decides by, unless the turn whose step asks for it (guardTid) no
-- longer runs or that copy of the step (guardToken) no longer owns it (step_owns), or the
-- session already has maxReminders live reminders (FLEET_MAX_REMINDERS_PER_SESSION; counted
-- here, with the insert).
-- The due time is published (Keys.reminders_wake): a poller asleep until a later reminder
-- wakes for this one.
-- Returns the due time (epoch ms) | 'stopped' | 'limit:<live reminders>'
local rid, sid = ARGV[2], ARGV[3]
if not step_owns(ARGV[9], ARGV[10]) then return 'stopped' end
local live = redis.call('SCARD', K.live_reminders(sid))
if live >= tonumber(ARGV[11]) then return 'limit:' .. live end
local due = server_ms() + tonumber(ARGV[6])
redis.call('HSET', K.reminder(rid), 'reminderId', rid, 'sessionId', sid,
  'prompt', ARGV[4], 'label', ARGV[5], 'dueAt', ARGV[7], 'createdAt', ARGV[8], 'state', REMINDER.ARMED)
redis.call('ZADD', K.reminders_due, due, rid)
redis.call('SADD', K.live_reminders(sid), rid)
sync_busy(sid)
redis.call('PUBLISH', K.reminders_wake, due)
return due
