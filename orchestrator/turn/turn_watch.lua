-- ARGV: prefix, tid, leaseMs|'', token
-- What a step in flight polls (watch_step in _lib.lua): the turn's state, or 'superseded'
-- when this copy of the step (token) no longer owns it while the turn is live (another copy
-- began: the watch cancels the step and drops its output). With leaseMs it refreshes its own
-- lease, and only its own; a lapsed lease is re-taken if no other copy began (holds_step).
-- Returns the state | 'superseded' | 'missing'.
return watch_step(ARGV[2], tonumber(ARGV[3]), ARGV[4] or '')
