"""The Celery beat schedule of ``fleet beat``: the auto-archive policy (``archive.auto`` on
the ``maintenance`` queue) every ``FLEET_AUTO_ARCHIVE_INTERVAL_SECONDS``."""

from __future__ import annotations

from typing import Any

from orchestrator.families import MAINTENANCE_QUEUE, Task


def beat_schedule(idle_seconds: float, interval_seconds: float) -> dict[str, Any]:
    """The ``beat_schedule`` setting: ``archive.auto`` with the idle age beat was started
    with (so every worker applies the same age), sent to ``maintenance``; empty when the
    policy is off (``idle_seconds`` 0)."""
    if idle_seconds <= 0:
        return {}
    return {
        "archive-auto": {
            "task": Task.ARCHIVE_AUTO,
            "schedule": float(interval_seconds),
            "args": (float(idle_seconds),),
            "options": {
                "queue": MAINTENANCE_QUEUE,
                "routing_key": MAINTENANCE_QUEUE,
                # A run that waited longer than one interval is superseded by the next one.
                "expires": float(interval_seconds),
            },
        }
    }
