"""The turn sweeper in every turn worker: a thread that runs ``orchestrator.sweeper.sweep``
every ``FLEET_TURN_SWEEP_INTERVAL_SECONDS``, so a turn whose step was lost is resumed or ended
while at least one turn worker is up. Sweepers on several workers overlap harmlessly: each
turn is decided by one script that re-scores what it resumed."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from orchestrator import sweeper
from orchestrator.settings import get_settings
from workers.runtime import get_runtime

log = logging.getLogger(__name__)


def _sweep_forever(stopping: threading.Event) -> None:
    rt = get_runtime()
    interval = get_settings().turn_sweep_interval_seconds
    while not stopping.wait(interval):
        try:
            report = sweeper.sweep(rt.store, rt.dispatcher)
        except Exception as exc:  # Redis or broker down: try again on the next tick
            log.warning("turn sweep failed: %s", exc)
            continue
        if any(report.totals.values()):
            log.info(
                "turn sweep: %s",
                ", ".join(f"{action} {n}" for action, n in report.totals.items() if n),
            )


@worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    if os.environ.get("FLEET_WORKER_FAMILY") == "turn":
        rt = get_runtime()
        threading.Thread(
            target=_sweep_forever, args=(rt.stopping,), name="turn-sweeper", daemon=True
        ).start()


@worker_shutdown.connect
def _stop_sweeper(**_: Any) -> None:
    get_runtime().stopping.set()
