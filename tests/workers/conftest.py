"""Fixtures of the worker tests: sessions that are stopped when the test ends."""

import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from orchestrator.settings import FleetSettings
from tests.live import sessions
from workers import runtime
from workers.app import configure, create_app
from workers.runtime import Runtime

__all__ = ["app", "sessions", "worker_runtime"]


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


@pytest.fixture
def app(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Celery]:
    """A Celery app configured as the fleet's, over its own key prefix (named after the test
    module); the prefix's keys are deleted and the app closed after the test."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    prefix = f"fleet-{name}-{uuid.uuid4().hex[:8]}:"
    app = Celery(name)
    configure(app, FleetSettings(redis_url=redis_url, key_prefix=prefix))
    yield app
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    app.close()
