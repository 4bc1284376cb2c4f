"""Fixtures of the worker tests: sessions that are stopped when the test ends."""

from collections.abc import Iterator

import pytest

from orchestrator.settings import FleetSettings
from tests.live import sessions
from workers import runtime
from workers.app import create_app
from workers.runtime import Runtime

__all__ = ["sessions", "worker_runtime"]


@pytest.fixture
def worker_runtime() -> Iterator[Runtime]:
    """This process acting as a worker: its settings (the test environment's) installed the
    way a worker's entry point installs them, and its runtime; put back as found after."""
    saved = (runtime._installed, runtime._runtime)
    settings = FleetSettings()
    runtime.install(settings, create_app(settings))
    rt = runtime.get_runtime()
    try:
        yield rt
    finally:
        rt.store.close()
        runtime._installed, runtime._runtime = saved
