"""Fixtures of the operations tests: what an operator runs beside the fleet (Flower, several
job hosts). They use real processes and read only what those processes expose."""

from tests.live import sessions

__all__ = ["sessions"]
