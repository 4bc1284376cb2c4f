-- Shared helpers, prepended to every script by orchestrator.store. Key templates mirror
-- orchestrator/keys.py; `P` is the key prefix, always ARGV[1].
local P = ARGV[1]

local function skey(sid) return P .. 'session:' .. sid end

local function idx(state, cwd_hash)
  if cwd_hash then return P .. 'idx:cwd:' .. cwd_hash .. ':' .. state end
  return P .. 'idx:' .. state
end

-- Move a session between the listing indexes of two states, keeping its score.
local function move_index(sid, from, to)
  local h = redis.call('HMGET', skey(sid), 'cwdHash', 'updatedMs')
  local score = tonumber(h[2]) or 0
  redis.call('ZREM', idx(from), sid)
  redis.call('ZREM', idx(from, h[1]), sid)
  redis.call('ZADD', idx(to), score, sid)
  redis.call('ZADD', idx(to, h[1]), score, sid)
end

-- Record activity on a session: updatedAt moves and the indexes are re-scored.
local function touch(sid, ms, iso_time)
  local k = skey(sid)
  local h = redis.call('HMGET', k, 'cwdHash', 'archived', 'deleted')
  if h[3] ~= '0' then return end
  redis.call('HSET', k, 'updatedAt', iso_time, 'updatedMs', ms)
  local state = (h[2] == '1') and 'archived' or 'active'
  redis.call('ZADD', idx('all'), ms, sid)
  redis.call('ZADD', idx(state), ms, sid)
  redis.call('ZADD', idx('all', h[1]), ms, sid)
  redis.call('ZADD', idx(state, h[1]), ms, sid)
end

-- The session and every descendant that is not deleted, breadth first.
local function subtree(sid)
  local out, queue, i = {}, {sid}, 1
  while queue[i] do
    local s = queue[i]
    i = i + 1
    -- A deleted session is left out, but its descendants are still walked.
    if redis.call('HGET', skey(s), 'deleted') == '0' then out[#out + 1] = s end
    for _, c in ipairs(redis.call('SMEMBERS', P .. 'children:' .. s)) do queue[#queue + 1] = c end
  end
  return out
end

-- Nearest archived session among sid and its ancestors, or false.
local function archived_in_lineage(sid)
  if redis.call('SISMEMBER', P .. 'archived', sid) == 1 then return sid end
  for _, a in ipairs(redis.call('LRANGE', P .. 'lineage:' .. sid, 0, -1)) do
    if redis.call('SISMEMBER', P .. 'archived', a) == 1 then return a end
  end
  return false
end

-- Whether the session itself has live work (its own turns, jobs, reminders).
local function has_live(sid)
  for _, t in ipairs(redis.call('ZRANGE', P .. 'turns:live:' .. sid, 0, -1)) do
    local st = redis.call('HGET', P .. 'turn:' .. t, 'state')
    if st == 'queued' or st == 'running' then return true end
    if st == 'cancelling' and redis.call('EXISTS', P .. 'turn:lease:' .. t) == 1 then return true end
  end
  if redis.call('SCARD', P .. 'reminders:live:' .. sid) > 0 then return true end
  for _, j in ipairs(redis.call('SMEMBERS', P .. 'jobs:live:' .. sid)) do
    local st = redis.call('HGET', P .. 'job:' .. j, 'state')
    if (st == 'starting' or st == 'running') and redis.call('EXISTS', P .. 'job:lease:' .. j) == 1 then
      return true
    end
  end
  return false
end

-- Move a turn to a terminal state; if it was the session's running turn, promote the oldest
-- queued turn. Returns the id of the promoted turn or ''.
local function finish_turn(tid, state, reason, err, ms, iso_time)
  local tk = P .. 'turn:' .. tid
  local sid = redis.call('HGET', tk, 'sessionId')
  redis.call('HSET', tk, 'state', state, 'stopReason', reason, 'error', err, 'endedAt', iso_time)
  redis.call('DEL', P .. 'turn:lease:' .. tid)
  redis.call('ZREM', P .. 'turns:live:' .. sid, tid)
  local active_key = P .. 'turn:active:' .. sid
  if redis.call('GET', active_key) ~= tid then return '' end
  redis.call('DEL', active_key)
  touch(sid, ms, iso_time)
  for _, nxt in ipairs(redis.call('ZRANGE', P .. 'turns:live:' .. sid, 0, -1)) do
    if redis.call('HGET', P .. 'turn:' .. nxt, 'state') == 'queued' then
      redis.call('HSET', P .. 'turn:' .. nxt, 'state', 'running')
      redis.call('SET', active_key, nxt)
      return nxt
    end
  end
  return ''
end
