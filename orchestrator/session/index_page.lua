-- ARGV: prefix, cwdHash ('' for the whole fleet), lastScore ('' for the first page),
-- lastMember, count
-- The next `count` entries of the index of sessions that are not archived (narrowed to one cwd
-- when cwdHash is given), after (lastScore, lastMember) in the index's order (score, then
-- member): {{member, score, member, score, ...}, {position, depth, ...}}, the second list the
-- lineage depth of each entry that is not a root (position 1-based; as bulk_depths.lua, in the
-- same call). The page starts where that entry is or would be now, so entries removed or moved
-- since the last page (a session archived or active meanwhile) shift no other entry past the
-- reader; an entry moved to a later place can be read twice, and the reader skips it.
local key = K.index('active', ARGV[2] ~= '' and ARGV[2] or nil)
local last_score, last, count = ARGV[3], ARGV[4], tonumber(ARGV[5])
local start = 0
if last_score ~= '' then
  local score = redis.call('ZSCORE', key, last)
  if score and tonumber(score) == tonumber(last_score) then
    start = redis.call('ZRANK', key, last) + 1
  else
    -- Gone or moved: count the entries that sort at or before where it was.
    start = redis.call('ZCOUNT', key, '-inf', '(' .. last_score)
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, last_score, last_score)) do
      if member > last then break end
      start = start + 1
    end
  end
end
local page = redis.call('ZRANGE', key, start, start + count - 1, 'WITHSCORES')
local members = {}
for i = 1, #page, 2 do members[#members + 1] = page[i] end
return {page, lineage_depths(members)}
