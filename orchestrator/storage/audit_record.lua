-- ARGV: prefix, rec (audit.script_recorder's JSON), then per entry
--       sid, action, outcome, detail (stored form)
-- Appends audit entries outside a change's own script (audit.record_into): each to the
-- session's trail and to the fleet-wide stream, as record_in_script (_lib.lua) does, the
-- fleet-wide stream trimmed once at the end. Their time is the server's clock now, so an
-- entry's time and its id (the stream's, from the same clock) sort alike. Returns the entry
-- ids, in order.
local rec = cjson.decode(ARGV[2])
local at = iso_ms(server_ms())
local ids = {}
for i = 3, #ARGV, 4 do
  ids[#ids + 1] = record_in_script(rec, ARGV[i], ARGV[i + 2], at, ARGV[i + 3], true, ARGV[i + 1])
end
trim_audit_all(rec)
return ids
