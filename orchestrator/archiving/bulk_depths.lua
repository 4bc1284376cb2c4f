-- ARGV: prefix, sid...
-- Lineage depths of a bulk selection's sessions (bulk_select.roots_first): one call per chunk
-- instead of an LLEN per session. Returns a flat list position (1-based), depth of the
-- sessions whose depth is not 0 (most sessions are roots).
return lineage_depths({unpack(ARGV, 2)})
