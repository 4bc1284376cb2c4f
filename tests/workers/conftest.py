"""Fixtures of the worker tests: sessions that are stopped when the test ends."""

from tests.live import sessions

__all__ = ["sessions"]
