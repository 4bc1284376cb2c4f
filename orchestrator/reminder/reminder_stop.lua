-- ARGV: prefix, sid, rid, ... Deletes exactly the named reminders of the session that are still
-- armed or firing (claimed, their turn not created yet: turn_create.lua then creates none), in
-- one step. A reminder already fired, deleted, or created after the stop was decided is left
-- alone. Returns the number deleted.
local sid = ARGV[2]
local deleted = 0
for i = 3, #ARGV do
  local rid = ARGV[i]
  local rk = K.reminder(rid)
  local h = redis.call('HMGET', rk, 'sessionId', 'state')
  if h[1] == sid and (h[2] == REMINDER.ARMED or h[2] == REMINDER.FIRING) then
    redis.call('ZREM', K.reminders_due, rid)
    redis.call('ZREM', K.reminders_firing, rid)
    redis.call('SREM', K.live_reminders(sid), rid)
    redis.call('HSET', rk, 'state', REMINDER.DELETED)
    deleted = deleted + 1
  end
end
if deleted > 0 then sync_busy(sid) end
return deleted
