"""Sessions: records, creation and deletion of the record, lineage, listing, titles, the
step gate, fencing tokens and the limits on what a session may start."""
