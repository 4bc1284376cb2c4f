"""``reminder.fire``, ``reminder.stop`` and the poller that claims due reminders."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from orchestrator import activity, reminders, turns
from orchestrator.errors import FleetError
from orchestrator.settings import get_settings
from workers.app import app
from workers.bulk import each_session
from workers.runtime import get_runtime

log = logging.getLogger(__name__)


def _poll_forever(stopping: threading.Event) -> None:
    rt = get_runtime()
    interval = get_settings().reminder_poll_seconds
    while not stopping.wait(interval):
        try:
            reminders.poll_once(rt.store, rt.dispatcher)
        except Exception as exc:  # Redis or broker down: try again on the next tick
            log.warning("reminder poll failed: %s", exc)


@worker_ready.connect
def _start_poller(**_: Any) -> None:
    if os.environ.get("FLEET_WORKER_FAMILY") == "reminder":
        rt = get_runtime()
        threading.Thread(
            target=_poll_forever, args=(rt.stopping,), name="reminder-poller", daemon=True
        ).start()


@worker_shutdown.connect
def _stop_poller(**_: Any) -> None:
    get_runtime().stopping.set()


@app.task(name="reminder.fire", acks_late=True)
def fire(session_id: str, reminder_id: str, prompt: str) -> dict[str, Any]:
    """Start the turn of a due reminder; its first step meets the gate like any other."""
    rt = get_runtime()
    try:
        tid = turns.start_turn(rt.store, rt.dispatcher, session_id, prompt, source="reminder")
    except FleetError as exc:
        log.info(
            "reminder %s not fired: %s",
            reminder_id,
            exc.message,
            extra={"session_id": session_id, "family": "reminder"},
        )
        return {"sessionId": session_id, "reminderId": reminder_id, "outcome": exc.code}
    return {"sessionId": session_id, "reminderId": reminder_id, "turnId": tid}


@app.task(name="reminder.stop", acks_late=True)
def stop(session_id: str) -> dict[str, Any]:
    """Delete every armed reminder of the session."""
    rt = get_runtime()
    deleted = reminders.stop_reminders(rt.store, session_id)
    activity.note_quiet(rt.store, session_id)
    return {"sessionId": session_id, "deleted": deleted}


@app.task(name="reminder.stop_many", acks_late=True)
def stop_many(session_ids: list[str]) -> dict[str, Any]:
    """Bulk form of ``reminder.stop`` (one message per bulk-archive batch): delete every
    armed reminder of each session; one that fails is logged and the others still run."""
    return {"sessions": each_session({sid: None for sid in session_ids}, stop, "reminder")}
