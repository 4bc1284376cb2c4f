-- ARGV: prefix, tid, leaseMs|''
-- What a step in flight polls: the turn's state, refreshing the step's lease when leaseMs is
-- given (the lease is only extended, never created). Returns the state or 'missing'.
local tid, lease_ms = ARGV[2], tonumber(ARGV[3])
if lease_ms then redis.call('PEXPIRE', P .. 'turn:lease:' .. tid, lease_ms) end
return redis.call('HGET', P .. 'turn:' .. tid, 'state') or 'missing'
