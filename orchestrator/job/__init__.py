"""Jobs: background processes a session owns on one host, their supervision, stops and
watchdog."""
