-- ARGV: prefix, tid, leaseMs|'', token
-- What a step in flight polls: the turn's state, or 'superseded' when this copy of the step
-- (token) no longer owns it while the turn is live (another copy began: the watch cancels the
-- step and drops its output). With leaseMs it refreshes its own lease, and only its own; a
-- lapsed lease is re-taken if no other copy began (holds_step).
-- Returns the state | 'superseded' | 'missing'.
local tid, lease_ms, token = ARGV[2], tonumber(ARGV[3]), ARGV[4] or ''
local st = redis.call('HGET', K.turn(tid), 'state') or 'missing'
if st ~= 'running' and st ~= 'cancelling' then return st end
if not holds_step(tid, token) then return 'superseded' end
if lease_ms then redis.call('PEXPIRE', K.step_lease(tid), lease_ms) end
return st
