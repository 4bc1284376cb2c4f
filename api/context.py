"""Shared wiring for the interfaces: one store and one dispatcher per process."""

from __future__ import annotations

from functools import lru_cache

from orchestrator.redisconn import SCHEMES, is_sentinel, parse_sentinel_url
from orchestrator.settings import get_settings
from orchestrator.store import Store
from workers.app import app
from workers.dispatch import CeleryDispatcher


def redis_url() -> str:
    """The configured Redis URL; raises ``SystemExit`` with a hint when none is set."""
    url = get_settings().redis_url
    if not url:
        raise SystemExit(
            "FLEET_REDIS_URL is not set. Point it at your Redis (redis://host:6379/0), or use "
            "`fleet up` / `fleet demo`, which start an embedded Redis."
        )
    if not url.startswith(SCHEMES):
        raise SystemExit(
            f"FLEET_REDIS_URL must start with redis://, rediss://, unix:// or sentinel:// "
            f"(got {url!r})."
        )
    if is_sentinel(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise SystemExit(f"FLEET_REDIS_URL: {exc}.") from exc
    return url


@lru_cache(maxsize=1)
def store() -> Store:
    """The process's store."""
    return Store(redis_url(), get_settings().key_prefix)


@lru_cache(maxsize=1)
def dispatcher() -> CeleryDispatcher:
    """The process's dispatcher (sends by task name; imports no task code)."""
    app.conf.broker_url = redis_url()
    return CeleryDispatcher(app)
