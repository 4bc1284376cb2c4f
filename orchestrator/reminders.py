"""Reminders: stored scheduled prompts, fired by a poller that claims due ones atomically.

Reminders are rows in Redis (``Keys.reminder`` + the ``reminders:due`` schedule), not Celery
ETA/countdown tasks: on the Redis transport those are redelivered after the visibility timeout
and can run twice, and an ETA task cannot be found or deleted by session. Archive admission
reads the stored rows, so a session with an armed reminder and no running turn still counts as
active. A fired reminder starts a turn that meets the gate like any other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from orchestrator.activity import shorten
from orchestrator.errors import TurnStopped
from orchestrator.families import Dispatcher, Family, Task, work_queue
from orchestrator.store import Store, iso, new_id, now_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DueReminder:
    """A reminder claimed by the poller: its id, session and prompt."""

    reminder_id: str
    session_id: str
    prompt: str


def create_reminder(
    store: Store, session_id: str, seconds: float, prompt: str, *, guard_turn: str = ""
) -> str:
    """Store a reminder due in ``seconds``. Returns its id.

    With ``guard_turn`` (the turn whose step asks for it) nothing is stored once that turn no
    longer runs: raises ``TurnStopped``. Raises ``StoreUnavailable``."""
    rid = new_id("rem")
    now = now_ms()
    due = now + int(seconds * 1000)
    stored = store.run(
        "reminder_create",
        [rid, session_id, prompt, shorten(prompt), due, iso(due), iso(now), guard_turn],
    )
    if stored == "stopped":
        raise TurnStopped(guard_turn)
    log.info("reminder %s armed for %s", rid, iso(due), extra={"session_id": session_id})
    return rid


def claim_due(store: Store, limit: int = 100) -> list[DueReminder]:
    """Atomically take up to ``limit`` reminders that are due now off the schedule."""
    flat = store.run("reminder_claim", [now_ms(), limit])
    return [DueReminder(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def poll_once(store: Store, dispatcher: Dispatcher, limit: int = 100) -> int:
    """Claim due reminders and send one ``reminder.fire`` task each. Returns how many."""
    due = claim_due(store, limit)
    for rem in due:
        dispatcher.send(
            Task.REMINDER_FIRE,
            [rem.session_id, rem.reminder_id, rem.prompt],
            work_queue(Family.REMINDER),
        )
    return len(due)


def stop_reminders(store: Store, session_id: str) -> int:
    """Delete every armed reminder of the session in one atomic step. Returns the count."""
    count = int(store.run("reminder_stop", [session_id]))
    log.info(
        "deleted %d reminder(s)", count, extra={"session_id": session_id, "family": "reminder"}
    )
    return count
