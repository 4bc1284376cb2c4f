"""The activity census: what is still live for a session, per family, and quiet marks."""
