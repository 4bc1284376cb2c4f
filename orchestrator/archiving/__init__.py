"""Archive, unarchive, delete and bulk archive, the stop fan-out and the reconciler: the
archive never hides running work."""
