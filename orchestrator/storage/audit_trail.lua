-- ARGV: prefix, sid
-- A session's audit trail as stored, oldest first, each entry the JSON object Keys.audit_log
-- holds: its list, then the one or two entries waiting in bulk archive batches (defer_trail
-- in _lib.lua; the session hash names the batches). One script, so an entry that a write
-- moves from its batch to the list is read in exactly one of them.
local sid = ARGV[2]
local out = redis.call('LRANGE', K.audit_log(sid), 0, -1)
local waiting = trail_waiting(sid)
for i = 1, #TRAIL_SLOTS do
  if waiting[i] then
    local entry = batch_entry(sid, i, waiting[i])
    if entry then out[#out + 1] = entry end
  end
end
return out
