-- ARGV: prefix, limit, refireMs
-- Claims up to `limit` reminders atomically, on the server's clock (TIME): first those whose
-- fire was not confirmed by their deadline (reminders:firing), then due ones (reminders:due).
-- Each becomes 'firing' with a new deadline and stays live (the census and stops still see it)
-- until turn_create.lua turns it into its one turn, or a stop deletes it. The deadline is
-- now + refireMs, doubled at each re-claim up to 8x: a backlog of fires slower than the
-- deadline is not flooded with copies (a copy is harmless, but it is work).
-- Two pollers never claim the same one at once. Returns a flat list: rid, sid, prompt, ...
local now = server_ms()
local limit, refire = tonumber(ARGV[2]), tonumber(ARGV[3])
local firing = K.reminders_firing
local out = {}
local function take(set, n)
  if n <= 0 then return end
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', set, '-inf', now, 'LIMIT', 0, n)) do
    redis.call('ZREM', set, rid)
    local rk = K.reminder(rid)
    local h = redis.call('HMGET', rk, 'sessionId', 'prompt', 'state')
    if h[1] and (h[3] == REMINDER.ARMED or h[3] == REMINDER.FIRING) then
      redis.call('HSET', rk, 'state', REMINDER.FIRING)
      local claims = redis.call('HINCRBY', rk, 'claims', 1)
      redis.call('ZADD', firing, now + refire * math.min(2 ^ (claims - 1), 8), rid)
      out[#out + 1] = rid; out[#out + 1] = h[1]; out[#out + 1] = h[2]
    end
  end
end
take(firing, limit)
take(K.reminders_due, limit - #out / 3)
return out
