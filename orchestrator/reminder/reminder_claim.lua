-- ARGV: prefix, limit, refireMs
-- Claims up to `limit` reminders atomically, on the server's clock (TIME): first those whose
-- fire was not confirmed by their deadline (reminders:firing), then due ones (reminders:due).
-- Each becomes 'firing' with a new deadline and stays live (the census and stops still see it)
-- until turn_create.lua turns it into its one turn, or a stop deletes it. The deadline is
-- now + refireMs, doubled at each re-claim up to 8x: a backlog of fires slower than the
-- deadline is not flooded with copies (a copy is harmless, but it is work).
-- Two pollers never claim the same one at once. A set whose first entry is not due yet is
-- not scanned (one ZRANGE reads its head), so a claim with nothing due costs two reads.
-- Returns {waitMs|-1, rid, sid, prompt, ...}: after the claimed ones' fields, waitMs is the
-- ms from now until the next entry of either set falls due (0: some are due now, more than
-- `limit`), -1 when both sets are empty.
local now = server_ms()
local limit, refire = tonumber(ARGV[2]), tonumber(ARGV[3])
local firing = K.reminders_firing
local out = {}
local function head(set)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2])
end
-- Claims up to n due entries of set; returns when the set's next entry falls due (or nil).
local function take(set, n)
  local first = head(set)
  if not first or first > now or n <= 0 then return first end
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
  return head(set)
end
take(firing, limit)
local next_due = take(K.reminders_due, limit - #out / 3)
-- Read after both claims: the due ones just claimed are firing now, with their deadlines.
local nxt = head(firing)
if next_due and (not nxt or next_due < nxt) then nxt = next_due end
local wait = -1
if nxt then wait = math.max(0, nxt - now) end
table.insert(out, 1, wait)
return out
