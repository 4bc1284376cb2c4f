"""Helpers shared by the tests (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


class RecordingDispatcher:
    """A dispatcher that records what it would send (for tests of the orchestrator alone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def send(self, task: str, args: list[Any], queue: str) -> None:
        self.sent.append((task, args, queue))


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
