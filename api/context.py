"""Shared wiring for the interfaces: one store and one dispatcher per process."""

from __future__ import annotations

from functools import lru_cache

from api.discovery import FleetNotFound, find
from orchestrator.errors import InvalidParams
from orchestrator.settings import FleetSettings, get_settings
from orchestrator.store import Store
from workers.app import app, configure
from workers.dispatch import CeleryDispatcher


@lru_cache(maxsize=1)
def settings() -> FleetSettings:
    """The process's settings; with ``FLEET_REDIS_URL`` unset, the Redis URL and key prefix
    of the ``fleet up`` running with the same state directory (``api/discovery.py``), if
    one does."""
    configured = get_settings()
    if configured.redis_url:
        return configured
    found = find(configured.state_dir)
    if found is None:
        return configured
    return configured.model_copy(
        update={"redis_url": found.redis_url, "key_prefix": found.key_prefix}
    )


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
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidParams(
            f"FLEET_REDIS_URL must start with redis://, rediss:// or unix:// (got {url!r}).",
            {"param": "FLEET_REDIS_URL"},
        )
    return url


@lru_cache(maxsize=1)
def store() -> Store:
    """The process's store."""
    return Store(redis_url(), settings().key_prefix)


@lru_cache(maxsize=1)
def dispatcher() -> CeleryDispatcher:
    """The process's dispatcher (sends by task name; imports no task code), on the broker
    and key prefix of ``settings()``."""
    redis_url()
    configure(app, settings())
    return CeleryDispatcher(app)
