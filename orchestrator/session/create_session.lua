-- ARGV: prefix, sid, cwd, cwdHash, parentId|'', nowMs, nowIso, guardTid|'', guardToken|'',
--       maxDepth, maxChildren, model|'', idemDigest|'', idemFingerprint, idemTtlMs, agent|''
-- With idemDigest (a client's idempotency key, orchestrator/storage/idempotency.py) a key seen before
-- answers {'replay', sid} (the session it created) or {'key_reused'} (another request) and
-- creates nothing; a created session records the key here, with the session.
-- With guardTid (a subagent spawned by a turn's step) nothing is created once that turn no
-- longer runs or that copy of the step (guardToken) no longer owns it (step_owns). A
-- subagent is refused when it would be deeper than maxDepth (FLEET_MAX_SUBAGENT_DEPTH; a
-- top-level session is at depth 0) or its parent already has maxChildren live direct
-- subagents (FLEET_MAX_SUBAGENTS_PER_SESSION: not deleted, with live work); counted here,
-- with the insert, among the parent's busy children only (Keys.busy_children: those holding
-- items, kept by every script that adds or removes one), never walking the idle ones; the
-- count stops at the cap (a refusal names the cap as the count), so a create reads about as
-- many children as the cap, plus those whose items are all stale. model is the model name
-- the session asks for; a subagent given none takes its parent's. agent names the external
-- agent that runs its turns ('': the built-in model); a subagent runs the built-in model.
-- Returns {'created', archived '0'|'1'} | {'replay', sid} | {'key_reused'} | {'exists'}
--   | {'parent_not_found'} | {'stopped'}
--   | {'limit', 'depth'|'children', count (the parent's depth | its live subagents)}
local sid, cwd, cwd_hash, parent = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ms, now = tonumber(ARGV[6]), ARGV[7]
local model = ARGV[12] or ''
local agent = ARGV[16] or ''
local idem, fp = ARGV[13] or '', ARGV[14] or ''
local seen = idem_seen('sessions', idem, fp)
if seen then return seen end
local k = skey(sid)
if redis.call('EXISTS', k) == 1 then return {'exists'} end
if not step_owns(ARGV[8], ARGV[9]) then return {'stopped'} end
local archived, txn, archived_at = '0', '', ''
if parent ~= '' then
  local pk = skey(parent)
  if redis.call('HGET', pk, 'deleted') ~= '0' then return {'parent_not_found'} end
  local depth = redis.call('LLEN', K.lineage(parent))
  if depth + 1 > tonumber(ARGV[10]) then return {'limit', 'depth', depth} end
  -- Fewer busy children than the cap: fewer live ones too. Else they are read a page at a
  -- time until the cap's worth is found live (stale ones do not count).
  local cap, live = tonumber(ARGV[11]), 0
  local busy = K.busy_children(parent)
  if cap > 0 and redis.call('SCARD', busy) >= cap then
    local cursor, seen = '0', {}
    repeat
      local page = redis.call('SSCAN', busy, cursor, 'COUNT', cap)
      cursor = page[1]
      for _, c in ipairs(page[2]) do
        if live < cap and not seen[c] and has_live(c) then live = live + 1 end
        seen[c] = true
      end
    until cursor == '0' or live >= cap
  end
  if live >= cap then return {'limit', 'children', live} end
  redis.call('RPUSH', K.lineage(sid), parent)
  local anc = redis.call('LRANGE', K.lineage(parent), 0, -1)
  for _, a in ipairs(anc) do redis.call('RPUSH', K.lineage(sid), a) end
  redis.call('SADD', K.children(parent), sid)
  if model == '' then model = redis.call('HGET', skey(parent), 'model') or '' end
  -- A child born under an archived lineage joins that archive transition, so it is hidden
  -- with its ancestor and restored with it.
  local holder = archived_in_lineage(parent)
  if holder then
    archived = '1'
    txn = redis.call('HGET', skey(holder), 'archiveTxn')
    archived_at = now
  end
end
-- The id is the key's suffix, so the hash does not store it.
redis.call('HSET', k, 'cwd', cwd, 'cwdHash', cwd_hash, 'parentId', parent,
  'title', '', 'titleSource', '', 'createdAt', now, 'updatedAt', now, 'updatedMs', ms,
  'archived', archived, 'archivedAt', archived_at, 'archiveTxn', txn, 'deleted', '0',
  'model', model, 'agent', agent)
local state = 'active'
if archived == '1' then
  state = 'archived'
  redis.call('SADD', K.archived, sid)
end
redis.call('ZADD', idx('all'), ms, sid)
redis.call('ZADD', idx(state), ms, sid)
redis.call('ZADD', idx('all', cwd_hash), ms, sid)
redis.call('ZADD', idx(state, cwd_hash), ms, sid)
idem_record('sessions', idem, fp, sid, ARGV[15])
return {'created', archived}
