"""Where the interfaces meet the workers: the one module of ``api/`` that imports ``workers``.

The interfaces reach the workers only through the domain's ``Dispatcher`` protocol (send a
task by name to a queue). ``celery_dispatcher`` is the factory an entry point uses to build
one; it imports the Celery app factory and no task code. (``CeleryDispatcher`` is named here
too because the readiness probe of ``api/ops.py`` still reaches for its Celery app.)
"""

from __future__ import annotations

from orchestrator.settings import FleetSettings
from workers.app import create_app
from workers.dispatch import CeleryDispatcher

__all__ = ["CeleryDispatcher", "celery_dispatcher"]


def celery_dispatcher(settings: FleetSettings) -> CeleryDispatcher:
    """A dispatcher publishing through a Celery app built for ``settings`` (its broker is
    ``settings.redis_url``). Raises ``MissingRedisUrl`` without a Redis URL."""
    return CeleryDispatcher(create_app(settings))
