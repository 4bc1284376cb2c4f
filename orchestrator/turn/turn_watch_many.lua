-- ARGV: prefix, then per step in flight a triple tid, leaseMs|'', token
-- turn_watch.lua for every step a worker process has in flight, in one call: per triple, the
-- turn's state, or 'superseded' when that copy of the step (token) no longer owns it while
-- the turn is live; with leaseMs its own lease is refreshed (holds_step re-takes a lapsed
-- one if no other copy began).
-- Returns a list of state | 'superseded' | 'missing', in ARGV order.
local out = {}
for i = 2, #ARGV, 3 do
  out[#out + 1] = watch_step(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2] or '')
end
return out
