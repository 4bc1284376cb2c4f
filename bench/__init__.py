"""Benchmarks of agent-fleet; run ``python -m bench.run``."""
