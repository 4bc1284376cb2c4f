-- ARGV: prefix, sid
-- After a stop or a step ended work of sid: records quiet where it is due, in one round trip
-- (activity.note_quiet). For sid, then each ancestor nearest first, while the session is
-- archived (and not deleted): one already recorded quiet for its archive transition is
-- passed; otherwise, if a session of its subtree still has live work (has_live: each
-- family's liveness rule), the walk ends; else it is marked quiet as mark_quiet.lua marks it
-- (with every session of its subtree archived in the same transition), at the server's time.
-- A stale item (its owner vanished) does not count as live here, as in the census; it is
-- left for a census to settle.
-- Returns a flat list: nowIso, then per session marked: sid, archivedAt, root ('1' when the
-- session is the one its transition was asked for).
local now = iso_ms(server_ms())
local chain = {ARGV[2]}
for _, a in ipairs(redis.call('LRANGE', K.lineage(ARGV[2]), 0, -1)) do chain[#chain + 1] = a end
local out = {now}
for _, sid in ipairs(chain) do
  local h = redis.call('HMGET', skey(sid), 'archived', 'deleted', 'archiveTxn', 'quietTxn',
    'archivedAt', 'parentId')
  if h[1] ~= '1' or h[2] ~= '0' then return out end
  local txn = h[3]
  if txn and txn ~= '' and h[4] ~= txn then
    local nodes = subtree(sid)
    for _, s in ipairs(nodes) do
      if has_live(s) then return out end
    end
    mark_transition_quiet(nodes, txn, now)
    out[#out + 1] = sid
    out[#out + 1] = h[5] or ''
    out[#out + 1] = transition_root(h[6], txn)
  end
end
return out
