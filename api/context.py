"""Wiring for the command-line entry points (the CLI, ACP over stdio): one store and one
dispatcher per process. The HTTP API does not use these: ``api.rest.create_app`` gives each
application its own (``api/deps.py``)."""

from __future__ import annotations

from functools import lru_cache

from api.deps import checked_redis_url
from orchestrator.settings import get_settings
from orchestrator.store import Store
from workers.app import app
from workers.dispatch import CeleryDispatcher


def redis_url() -> str:
    """The configured Redis URL; raises ``SystemExit`` with a hint when none is set."""
    return checked_redis_url(get_settings())


@lru_cache(maxsize=1)
def store() -> Store:
    """The process's store."""
    return Store(redis_url(), get_settings().key_prefix)


@lru_cache(maxsize=1)
def dispatcher() -> CeleryDispatcher:
    """The process's dispatcher (sends by task name; imports no task code)."""
    app.conf.broker_url = redis_url()
    return CeleryDispatcher(app)
