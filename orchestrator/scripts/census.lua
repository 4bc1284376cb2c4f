-- ARGV: prefix, sid...
-- The census of sessions' own items, by each family's liveness rule (FAMILIES, _lib.lua).
-- Read only. Returns, per session, census_rows(sid) (_lib.lua): per family in registry order
-- {name, {{id, field...}, ...} (live items with the family's label fields), {stale id, ...}}
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = census_rows(ARGV[i])
end
return out
