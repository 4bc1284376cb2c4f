-- ARGV: prefix, sid...
-- Lineage depths of a bulk selection's sessions (bulk_select.roots_first): one call per chunk
-- instead of an LLEN per session. Returns a flat list position (1-based), depth of the
-- sessions whose depth is not 0 (most sessions are roots).
local out = {}
for i = 2, #ARGV do
  local n = redis.call('LLEN', K.lineage(ARGV[i]))
  if n > 0 then
    out[#out + 1] = i - 1
    out[#out + 1] = n
  end
end
return out
