-- ARGV: prefix, nowMs, limit
-- Claims due reminders atomically: each is removed from the schedule here, so two pollers
-- never fire the same one. Returns a flat list: rid, sid, prompt, ...
local due = redis.call('ZRANGEBYSCORE', P .. 'reminders:due', '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {}
for _, rid in ipairs(due) do
  redis.call('ZREM', P .. 'reminders:due', rid)
  local rk = P .. 'reminder:' .. rid
  local h = redis.call('HMGET', rk, 'sessionId', 'prompt')
  if h[1] then
    redis.call('SREM', P .. 'reminders:live:' .. h[1], rid)
    redis.call('HSET', rk, 'state', 'fired')
    out[#out + 1] = rid; out[#out + 1] = h[1]; out[#out + 1] = h[2]
  end
end
return out
