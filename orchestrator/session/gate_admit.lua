-- ARGV: prefix, sid
-- The step gate as one read (orchestrator/session/gate.py); the rule is gate_refusal in _lib.lua.
-- Returns 'ok' | 'missing' | 'deleted' | 'archived'
return gate_refusal(ARGV[2]) or 'ok'
