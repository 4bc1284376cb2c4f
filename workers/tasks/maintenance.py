"""Scheduled fleet-wide tasks on the ``maintenance`` queue (which reminder workers consume);
``fleet beat`` schedules them: ``archive.auto`` (one run of the auto-archive policy) and
``archive.reconcile`` (one pass of the archive reconciler). Every reminder worker also runs
the reconciler as a loop of its own (``workers.periodic``), so archives converge without beat."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from orchestrator.archiving import bulk, reconcile
from orchestrator.errors import InvalidParams
from workers.periodic import every
from workers.runtime import Runtime, get_runtime

log = logging.getLogger(__name__)

#: Most archived ids a run's result lists (the totals count all of them).
_LISTED = 100


@shared_task(name="archive.auto", acks_late=True)
def auto(idle_seconds: float | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Archive sessions idle longer than ``idle_seconds`` (``fleet beat`` passes its
    ``--idle-seconds``; none: the run is off) with no live work; ``cwd`` narrows the run to one
    directory. Overlapping runs are harmless: each session is checked and written atomically."""
    rt = get_runtime()
    try:
        result = bulk.auto_archive(rt.store, rt.dispatcher, idle_seconds=idle_seconds, cwd=cwd)
    except InvalidParams as exc:
        log.info("auto-archive skipped: %s", exc.message)
        return {"outcome": "off", "message": exc.message}
    archived = [i.session_id for i in result.results if i.outcome == "archived"]
    return {"outcome": "ran", "totals": result.totals, "archived": archived[:_LISTED]}


@shared_task(name="archive.reconcile", acks_late=True)
def reconcile_archives(interval_seconds: float | None = None) -> dict[str, Any]:
    """One pass of the archive reconciler with this worker's ``FLEET_RECONCILE_*`` settings;
    a session flagged with a hazard is retried every 10 x ``interval_seconds`` (beat passes
    its interval; default ``FLEET_RECONCILE_INTERVAL_SECONDS``). Overlapping runs are
    harmless: a duplicate stop is a no-op, and the bookkeeping is written by one script."""
    return _reconcile(get_runtime(), interval_seconds).to_wire()


@every("reminder", "archive-reconciler", lambda s: s.reconcile_interval_seconds)
def reconcile_loop(rt: Runtime) -> None:
    """The reconciler as a loop of every reminder worker, so an archive whose stops were lost
    converges with no scheduler deployed (every ``FLEET_RECONCILE_INTERVAL_SECONDS``; 0: no
    loop)."""
    _reconcile(rt, None)


def _reconcile(rt: Runtime, interval_seconds: float | None) -> reconcile.Report:
    settings = rt.settings
    interval = interval_seconds or settings.reconcile_interval_seconds
    report = reconcile.reconcile(
        rt.store,
        rt.dispatcher,
        grace_seconds=settings.reconcile_grace_seconds,
        backoff_seconds=reconcile.hazard_backoff_seconds(interval),
    )
    if report.restopped or report.cleared:
        log.info(
            "reconcile: %d examined, %d stopped again, %d new hazard(s), %d cleared",
            report.examined,
            report.restopped,
            report.hazards,
            report.cleared,
        )
    return report
