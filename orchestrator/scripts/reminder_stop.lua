-- ARGV: prefix, sid. Deletes every armed reminder of the session in one step.
-- Returns the number deleted.
local sid = ARGV[2]
local live = P .. 'reminders:live:' .. sid
local ids = redis.call('SMEMBERS', live)
for _, rid in ipairs(ids) do
  redis.call('ZREM', P .. 'reminders:due', rid)
  redis.call('HSET', P .. 'reminder:' .. rid, 'state', 'deleted')
end
redis.call('DEL', live)
return #ids
