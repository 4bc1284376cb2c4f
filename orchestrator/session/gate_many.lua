-- ARGV: prefix, sid...
-- The step gate (gate_refusal in _lib.lua) for several sessions in one read: a job host asks
-- it for the sessions of the jobs it runs when it hears the gate's closure
-- (orchestrator/job/jobgatewatch.py, gate.listen).
-- Returns 'ok' | 'missing' | 'deleted' | 'archived' per sid, in ARGV order.
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = gate_refusal(ARGV[i]) or 'ok'
end
return out
