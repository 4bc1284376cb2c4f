"""The Celery beat schedule of ``fleet beat``: the auto-archive policy (``archive.auto``)
every ``fleet beat --interval`` seconds when it is on, and the archive reconciler
(``archive.reconcile``) every ``FLEET_RECONCILE_INTERVAL_SECONDS`` unless 0, both on the
``maintenance`` queue."""

from __future__ import annotations

from typing import Any

from orchestrator.families import MAINTENANCE_QUEUE, Task


def _entry(task: str, interval_seconds: float, arg: float) -> dict[str, Any]:
    """A schedule entry: ``task(arg)`` every ``interval_seconds`` on the maintenance queue."""
    return {
        "task": task,
        "schedule": float(interval_seconds),
        "args": (float(arg),),
        "options": {
            "queue": MAINTENANCE_QUEUE,
            "routing_key": MAINTENANCE_QUEUE,
            # A run that waited longer than one interval is superseded by the next one.
            "expires": float(interval_seconds),
        },
    }


def beat_schedule(
    idle_seconds: float, interval_seconds: float, reconcile_seconds: float = 0
) -> dict[str, Any]:
    """The ``beat_schedule`` setting: ``archive.auto`` with the idle age beat was started
    with (so every worker applies the same age), absent when the policy is off
    (``idle_seconds`` 0); ``archive.reconcile`` every ``reconcile_seconds`` (absent when 0),
    given its interval so hazards back off by 10 intervals. Both go to ``maintenance``."""
    schedule: dict[str, Any] = {}
    if idle_seconds > 0:
        schedule["archive-auto"] = _entry(Task.ARCHIVE_AUTO, interval_seconds, idle_seconds)
    if reconcile_seconds > 0:
        schedule["archive-reconcile"] = _entry(
            Task.ARCHIVE_RECONCILE, reconcile_seconds, reconcile_seconds
        )
    return schedule
