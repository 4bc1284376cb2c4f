"""Wiring for the command-line entry points (the CLI, ACP over stdio): one store and one
dispatcher per process. The HTTP API does not use these: ``api.rest.create_app`` gives each
application its own (``api/deps.py``)."""

from __future__ import annotations

from functools import lru_cache

from orchestrator.settings import FleetSettings, get_settings
from orchestrator.store import Store
from workers.app import app
from workers.dispatch import CeleryDispatcher


def checked_redis_url(settings: FleetSettings) -> str:
    """``settings.redis_url``; raises ``SystemExit`` with a hint when it is missing or is not
    a Redis URL (the README's documented error)."""
    url = settings.redis_url
    if not url:
        raise SystemExit(
            "FLEET_REDIS_URL is not set. Point it at your Redis (redis://host:6379/0), or use "
            "`fleet up` / `fleet demo`, which start an embedded Redis."
        )
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit(
            f"FLEET_REDIS_URL must start with redis://, rediss:// or unix:// (got {url!r})."
        )
    return url


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
