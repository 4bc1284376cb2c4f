-- ARGV: prefix, archivedOnly '0'|'1', sid...
-- The census of sessions' own items, by each family's liveness rule (FAMILIES, _lib.lua).
-- Read only. Returns, per session, census_rows(sid) (_lib.lua): per family in registry order
-- {name, {{id, field...}, ...} (live items with the family's label fields), {stale id, ...}}.
-- With archivedOnly (a census whose items are to be stopped: the bulk archive's, the
-- reconciler's) a session that is not archived when this runs reads as {} (nothing live): it
-- was unarchived since the caller chose it, and what it runs now, maybe created after that
-- unarchive, is not the archive's to stop.
local only = ARGV[2] == '1'
local out = {}
for i = 3, #ARGV do
  local sid = ARGV[i]
  if only and redis.call('SISMEMBER', K.archived, sid) == 0 then
    out[#out + 1] = {}
  else
    out[#out + 1] = census_rows(sid)
  end
end
return out
