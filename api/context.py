"""Wiring for the command-line entry points (the CLI, ACP over stdio): one store and one
dispatcher per process. The HTTP API does not use these: ``api.rest.create_app`` gives each
application its own (``api/deps.py``).

The dispatcher is built by a factory (``api.wiring.celery_dispatcher`` unless an entry point
or a test hands another to ``use_dispatcher_factory``), so the interfaces reach the workers
only through the domain's ``Dispatcher`` protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from api.wiring import CeleryDispatcher, celery_dispatcher
from localfleet.discovery import FleetNotFound, find
from orchestrator.errors import InvalidParams
from orchestrator.settings import FleetSettings, MissingRedisUrl, get_settings
from orchestrator.storage.redisconn import SCHEMES, is_sentinel, parse_sentinel_url
from orchestrator.storage.store import Store

#: Builds the process's dispatcher from its settings.
DispatcherFactory = Callable[[FleetSettings], CeleryDispatcher]

_factory: DispatcherFactory = celery_dispatcher


def checked_redis_url(settings: FleetSettings) -> str:
    """``settings.redis_url``; raises ``SystemExit`` with a hint when it is missing or is not
    a Redis URL (the error `docs/cli.md` documents)."""
    try:
        return settings.require_redis_url()
    except MissingRedisUrl as exc:
        raise SystemExit(str(exc)) from None


@lru_cache(maxsize=1)
def settings() -> FleetSettings:
    """The process's settings; with ``FLEET_REDIS_URL`` unset, the Redis URL and key prefix
    of the ``fleet up`` running with the same state directory (``localfleet/discovery.py``), if
    one does, and that fleet's agents (``FLEET_AGENTS_FILE``, ``FLEET_AGENT``) unless this
    process's environment sets them."""
    configured = get_settings()
    if configured.redis_url:
        return configured
    found = find(configured.state_dir)
    if found is None:
        return configured
    update: dict[str, object] = {"redis_url": found.redis_url, "key_prefix": found.key_prefix}
    # The fleet's agents, unless this command's environment names its own.
    if "FLEET_AGENTS_FILE" not in os.environ and found.agents_file:
        update["agents_file"] = Path(found.agents_file)
    if "FLEET_AGENT" not in os.environ and found.agent:
        update["agent"] = found.agent
    return configured.model_copy(update=update)


def redis_url(*, discover: bool = True) -> str:
    """The Redis URL to use. Raises ``FleetNotFound`` (saying what to do) when none is set
    and no local fleet is found, ``InvalidParams`` for a URL of another scheme. Without
    ``discover`` (a worker, beat or API process, whose modules read the key prefix from the
    environment) only ``FLEET_REDIS_URL`` counts."""
    current = settings() if discover else get_settings()
    url = current.redis_url
    if not url and not discover:
        raise InvalidParams(
            "FLEET_REDIS_URL is not set: this process serves the fleet on that Redis "
            "(redis://HOST:6379/0, with its FLEET_KEY_PREFIX). `fleet up` runs a whole local "
            "fleet instead.",
            {"param": "FLEET_REDIS_URL"},
        )
    if not url:
        raise FleetNotFound(current.state_dir)
    if not url.startswith(SCHEMES):
        raise InvalidParams(
            f"FLEET_REDIS_URL must start with redis://, rediss://, unix:// or sentinel:// "
            f"(got {url!r}).",
            {"param": "FLEET_REDIS_URL"},
        )
    if is_sentinel(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise InvalidParams(f"FLEET_REDIS_URL: {exc}.", {"param": "FLEET_REDIS_URL"}) from exc
    return url


@lru_cache(maxsize=1)
def store() -> Store:
    """The process's store."""
    return Store(redis_url(), settings().key_prefix, settings=settings())


@lru_cache(maxsize=1)
def dispatcher() -> CeleryDispatcher:
    """The process's dispatcher (sends by task name; imports no task code), on the broker
    and key prefix of ``settings()``."""
    redis_url()
    return _factory(settings())


def use_dispatcher_factory(factory: DispatcherFactory) -> None:
    """Build the process's dispatcher with ``factory`` from now on."""
    global _factory
    _factory = factory
    dispatcher.cache_clear()
