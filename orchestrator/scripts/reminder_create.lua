-- ARGV: prefix, rid, sid, prompt, label, delayMs, dueIso, nowIso
-- The reminder is due delayMs after now on the server's clock (TIME), the clock the claim
-- (reminder_claim.lua) decides by. Returns the due time (epoch ms).
local rid, sid = ARGV[2], ARGV[3]
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[6])
redis.call('HSET', P .. 'reminder:' .. rid, 'reminderId', rid, 'sessionId', sid,
  'prompt', ARGV[4], 'label', ARGV[5], 'dueAt', ARGV[7], 'createdAt', ARGV[8], 'state', 'armed')
redis.call('ZADD', P .. 'reminders:due', due, rid)
redis.call('SADD', P .. 'reminders:live:' .. sid, rid)
return due
