-- ARGV: prefix, sid, nowIso
-- Marks an archived session quiet for its current archive transition, with every session of
-- its subtree archived in that same transition (a census that found the session quiet covered
-- its subtree). A session archived again later gets a new transition and is marked anew.
-- Returns {} when nothing was newly marked, else {archivedAt, root}: root is '1' when the
-- session is the one its transition was asked for (its parent is not in the transition).
local sid, now = ARGV[2], ARGV[3]
local h = redis.call('HMGET', skey(sid), 'archived', 'deleted', 'archiveTxn', 'quietTxn',
  'archivedAt', 'parentId')
if h[1] ~= '1' or h[2] ~= '0' or not h[3] or h[3] == '' or h[4] == h[3] then return {} end
local txn = h[3]
mark_transition_quiet(subtree(sid), txn, now)
return {h[5] or '', transition_root(h[6], txn)}
