-- ARGV: prefix, sid...
-- The census of sessions' own items, by each family's liveness rule (FAMILIES, _lib.lua).
-- Read only. Returns, per session, per family in registry order:
-- {name, {{id, field...}, ...} (live items with the family's label fields), {stale id, ...}}
local out = {}
for i = 2, #ARGV do
  local per = {}
  for _, f in ipairs(FAMILIES) do
    local live, stale = {}, {}
    for _, id in ipairs(f.ids(ARGV[i])) do
      local verdict = f.verdict(id)
      if verdict == 'stale' then
        stale[#stale + 1] = id
      elseif verdict then
        local row = {id}
        if #f.fields > 0 then
          for _, v in ipairs(redis.call('HMGET', f.hash(id), unpack(f.fields))) do
            row[#row + 1] = v
          end
        end
        live[#live + 1] = row
      end
    end
    per[#per + 1] = {f.name, live, stale}
  end
  out[#out + 1] = per
end
return out
