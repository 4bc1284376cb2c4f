"""Wiring for the command-line entry points (the CLI, ACP over stdio): one store and one
dispatcher per process. The HTTP API does not use these: ``api.rest.create_app`` gives each
application its own (``api/deps.py``).

The dispatcher is built by a factory (``api.wiring.celery_dispatcher`` unless an entry point
or a test hands another to ``use_dispatcher_factory``), so the interfaces reach the workers
only through the domain's ``Dispatcher`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from api.wiring import CeleryDispatcher, celery_dispatcher
from orchestrator.settings import FleetSettings, MissingRedisUrl, get_settings
from orchestrator.store import Store

#: Builds the process's dispatcher from its settings.
DispatcherFactory = Callable[[FleetSettings], CeleryDispatcher]

_factory: DispatcherFactory = celery_dispatcher


def checked_redis_url(settings: FleetSettings) -> str:
    """``settings.redis_url``; raises ``SystemExit`` with a hint when it is missing or is not
    a Redis URL (the README's documented error)."""
    try:
        return settings.require_redis_url()
    except MissingRedisUrl as exc:
        raise SystemExit(str(exc)) from None


def redis_url() -> str:
    """The configured Redis URL; raises ``SystemExit`` with a hint when none is set (or it is
    not a Redis URL)."""
    return checked_redis_url(get_settings())


@lru_cache(maxsize=1)
def store() -> Store:
    """The process's store."""
    # No settings= yet: its store.settings stay the environment's (get_settings), which the
    # REST tests re-read between cases until create_app takes its settings.
    return Store(redis_url(), get_settings().key_prefix)


@lru_cache(maxsize=1)
def dispatcher() -> CeleryDispatcher:
    """The process's dispatcher (sends by task name; imports no task code)."""
    redis_url()
    return _factory(get_settings())


def use_dispatcher_factory(factory: DispatcherFactory) -> None:
    """Build the process's dispatcher with ``factory`` from now on."""
    global _factory
    _factory = factory
    dispatcher.cache_clear()
