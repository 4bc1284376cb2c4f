"""``reminder.fire``, ``reminder.stop`` and the poller that claims due reminders (a loop of
every reminder worker, ``workers.periodic``)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from orchestrator.census import activity
from orchestrator.errors import FleetError, StoreUnavailable
from orchestrator.reminder import poller, reminders
from orchestrator.turn import turns
from workers.bulk import each_session
from workers.periodic import background
from workers.runtime import Runtime, get_runtime

log = logging.getLogger(__name__)


@background("reminder", "reminder-poller")
def poll_reminders(rt: Runtime) -> None:
    """Claim due reminders (and those whose fire was not confirmed) and send their fires as
    they fall due, asleep in between (``orchestrator/reminder/poller.py``), until the worker
    stops."""
    poller.run(rt.store, rt.dispatcher, rt.stopping)


@shared_task(name="reminder.fire", acks_late=True)
def fire(session_id: str, reminder_id: str, prompt: str) -> dict[str, Any]:
    """Turn a claimed reminder into its one turn (created at most once per reminder, however
    often this is delivered); its first step meets the gate like any other. A fire that could
    not reach the store or the broker is retried (``workers.retry.FleetTask``); one that
    created nothing is acknowledged only when it is a repeat, or the reminder was stopped or
    refused (archived lineage, deleted session). If even the retry is lost, the poller claims
    the reminder again after its deadline."""
    rt = get_runtime()
    out: dict[str, Any] = {"sessionId": session_id, "reminderId": reminder_id}
    try:
        tid = turns.start_turn(
            rt.store, rt.dispatcher, session_id, prompt, source="reminder", reminder_id=reminder_id
        )
    except StoreUnavailable:
        raise  # retried by the task's base class
    except FleetError as exc:
        log.info(
            "reminder %s not fired: %s",
            reminder_id,
            exc.message,
            extra={"session_id": session_id, "family": "reminder"},
        )
        return {**out, "outcome": exc.code}
    return {**out, "turnId": tid} if tid else {**out, "outcome": "stopped"}


@shared_task(name="reminder.stop", acks_late=True)
def stop(session_id: str, reminder_ids: list[str]) -> dict[str, Any]:
    """Delete exactly the named reminders of the session (those still armed or firing).
    Returns ``{"sessionId", "deleted"}`` (how many were deleted)."""
    rt = get_runtime()
    deleted = reminders.stop_reminders(rt.store, session_id, list(reminder_ids))
    activity.note_quiet(rt.store, session_id)
    return {"sessionId": session_id, "deleted": deleted}


@shared_task(name="reminder.stop_many", acks_late=True)
def stop_many(stops: dict[str, list[str]]) -> dict[str, Any]:
    """Bulk form of ``reminder.stop`` (one message per bulk-archive batch): ``{sessionId:
    [reminderIds]}``. Each session is handled on its own; one that fails is logged and the
    others are still stopped."""
    return {"sessions": each_session(stops, stop, "reminder")}
