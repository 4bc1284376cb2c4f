-- ARGV: prefix, then per step in flight a triple tid, leaseMs|'', token
-- turn_watch.lua for every step a worker process has in flight, in one call: per triple, the
-- turn's state, or 'superseded' when that copy of the step (token) no longer owns it while
-- the turn is live; with leaseMs its own lease is refreshed (holds_step re-takes a lapsed
-- one if no other copy began).
-- Returns a list of state | 'superseded' | 'missing', in ARGV order.
local out = {}
for i = 2, #ARGV, 3 do
  local tid, lease_ms, token = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2] or ''
  local st = redis.call('HGET', K.turn(tid), 'state') or 'missing'
  if st == 'running' or st == 'cancelling' then
    if not holds_step(tid, token) then
      st = 'superseded'
    elseif lease_ms then
      redis.call('PEXPIRE', K.step_lease(tid), lease_ms)
    end
  end
  out[#out + 1] = st
end
return out
