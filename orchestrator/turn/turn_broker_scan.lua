-- ARGV: prefix, queue, scanLimit, tid...
-- What the broker holds of the current step of each turn the sweeper suspects (a member of
-- turns:inflight with no progress for stuckMs): read-only, one pass over the turn queue and
-- one over kombu's unacked hash for all of them, so many suspects cost one scan.
-- A turn is looked for only when it is running and its step holds no lease; its step's
-- messages carry the task id '<tid>.step.<step>' (families.step_message_id builds the same),
-- found as the "id" field of a message's headers (kombu keeps a queued message as its JSON
-- text, an unacked one as JSON [message, exchange, routingKey]).
-- At most scanLimit messages of the queue (the oldest first: kombu pushes on the left and
-- takes from the right) and scanLimit entries of the unacked hash are read.
-- Returns, per tid in order, three values: what was seen, the step looked for, the
-- delivery tag:
--   'skip'   not looked for (not running, or its step holds its lease);
--   'queued' a message of the step waits in the queue;
--   'held'   a worker took a message of the step and has not acknowledged it (tag);
--   'unseen' in neither part read, but the queue or the hash was longer than scanLimit;
--   'absent' in neither: the step's message is lost.
local queue, limit = ARGV[2], tonumber(ARGV[3])
local CHUNK = 500
local out, wanted, any = {}, {}, false

for i = 4, #ARGV do
  local tid = ARGV[i]
  local h = redis.call('HMGET', K.turn(tid), 'state', 'step')
  if h[1] == TURN.RUNNING and redis.call('EXISTS', K.step_lease(tid)) == 0 then
    local step = h[2] or '0'
    out[i] = {'absent', step, ''}
    wanted[tid .. '.step.' .. step] = i
    any = true
  else
    out[i] = {'skip', '', ''}
  end
end

local truncated = false
if any then
  local function look(text, seen, tag)
    for id in string.gmatch(text, '"id":%s*"([^"]*)"') do
      local at = wanted[id]
      -- A copy in the queue outweighs one taken; of several taken, the least tag (the
      -- same one every pass, so its age can be measured).
      local row = at and out[at]
      if row and row[1] ~= 'queued' and (seen == 'queued' or row[1] ~= 'held' or tag < row[3])
      then
        row[1] = seen
        row[3] = tag
      end
    end
  end

  local qk = K.broker_queue(queue)
  local qlen = redis.call('LLEN', qk)
  local n = math.min(qlen, limit)
  truncated = qlen > limit
  local done = 0
  while done < n do
    local take = math.min(CHUNK, n - done)
    local chunk = redis.call('LRANGE', qk, -(done + take), -(done + 1))
    for _, m in ipairs(chunk) do look(m, 'queued', '') end
    done = done + take
  end

  local uk = K.broker_unacked
  local read, cursor = 0, '0'
  repeat
    local page = redis.call('HSCAN', uk, cursor, 'COUNT', CHUNK)
    cursor = page[1]
    local rows = page[2]
    for j = 1, #rows, 2 do
      look(rows[j + 1], 'held', rows[j])
      read = read + 1
    end
  until cursor == '0' or read >= limit
  if cursor ~= '0' then truncated = true end
end

local reply = {}
for i = 4, #ARGV do
  local row = out[i]
  if row[1] == 'absent' and truncated then row[1] = 'unseen' end
  reply[#reply + 1] = row[1]
  reply[#reply + 1] = row[2]
  reply[#reply + 1] = row[3]
end
return reply
