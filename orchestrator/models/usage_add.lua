-- ARGV: prefix, sid, tid, inputTokens, outputTokens
-- Adds a model step's token usage to its turn and its session, only to records that exist
-- (a deleted session's or a purged turn's hash is never recreated as a fragment).
local counts = {tonumber(ARGV[4]), tonumber(ARGV[5])}
for _, k in ipairs({K.session(ARGV[2]), K.turn(ARGV[3])}) do
  if redis.call('EXISTS', k) == 1 then
    redis.call('HINCRBY', k, 'inputTokens', counts[1])
    redis.call('HINCRBY', k, 'outputTokens', counts[2])
  end
end
return 1
