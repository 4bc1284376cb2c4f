"""Reminders: stored scheduled prompts, fired by a poller that claims due ones atomically.

Reminders are rows in Redis (``Keys.reminder`` + the ``reminders:due`` schedule), not Celery
ETA/countdown tasks: on the Redis transport those are redelivered after the visibility timeout
and can run twice, and an ETA task cannot be found or deleted by session. Archive admission
reads the stored rows, so a session with an armed reminder and no running turn still counts as
active. A fired reminder starts a turn that meets the gate like any other.

A due reminder becomes a turn exactly once across any crash: delivery is at least once and
the turn's creation is idempotent, keyed by the reminder.

- ``armed`` -> ``firing``: the poller claims it (``reminder_claim.lua``, on the Redis clock)
  and sends ``reminder.fire``. It stays live (census, stops) and gets a re-claim deadline
  (``Keys.reminders_firing``, ``reminder_refire_seconds``): if its turn is not created by
  then (the poller died before sending, the message or its worker was lost) it is claimed
  and sent again.
- ``firing`` -> ``fired`` (with ``turnId``): ``turn_create.lua`` creates the turn and spends
  the reminder in one script; a second fire of it returns that turn and creates nothing.
- ``armed``/``firing`` -> ``deleted``: a stop naming it (``stop_reminders``); a fire that
  arrives afterwards creates nothing. ``refused``: it fell due under an archived lineage
  (nothing is stored). ``dropped``: its session was deleted.
"""

from __future__ import annotations

import logging
import re

from orchestrator.census.activity import shorten
from orchestrator.errors import TurnStopped
from orchestrator.families import Dispatcher, Family, Task, send_all, work_queue
from orchestrator.reminder import scripts
from orchestrator.reminder.scripts import AtLimit, DueReminder, GuardLost
from orchestrator.session import limits
from orchestrator.session.fencing import StepGuard
from orchestrator.storage.store import Store, iso, new_id

log = logging.getLogger(__name__)

#: A reminder id as ``create_reminder`` makes them (anything else never reaches a key name).
REMINDER_ID_RE = re.compile(r"^rem_[0-9a-f]{1,64}$")


__all__ = [
    "DueReminder",
    "claim_due",
    "create_reminder",
    "poll",
    "poll_once",
    "stop_reminders",
]


def create_reminder(
    store: Store,
    session_id: str,
    seconds: float,
    prompt: str,
    *,
    guard: StepGuard | None = None,
) -> str:
    """Store a reminder due in ``seconds`` (on the Redis server's clock). Returns its id.

    With ``guard`` (the copy of the step that asks for it) nothing is stored once its turn no
    longer runs or that copy no longer owns the step (``orchestrator/session/fencing.py``): raises
    ``TurnStopped``. Raises ``LimitReached`` when the session already has
    ``FLEET_MAX_REMINDERS_PER_SESSION`` live reminders (counted in the script that stores the
    reminder), ``StoreUnavailable``."""
    rid = new_id("rem")
    now = store.now_ms()
    delay = max(0, int(seconds * 1000))
    maximum = limits.REMINDERS_PER_SESSION.maximum(store.settings)
    stored = scripts.reminder_create(
        store,
        reminder_id=rid,
        session_id=session_id,
        prompt=prompt,
        label=shorten(prompt),
        delay_ms=delay,
        due_at=iso(now + delay),
        created_at=iso(now),
        guard=guard,
        max_live=maximum,
    )
    if isinstance(stored, GuardLost):
        raise TurnStopped(guard.turn_id if guard else "")
    if isinstance(stored, AtLimit):
        raise limits.REMINDERS_PER_SESSION.reached(maximum, stored.live)
    log.info("reminder %s armed for %s", rid, iso(now + delay), extra={"session_id": session_id})
    return rid


def claim_due(
    store: Store, limit: int = 100, refire_seconds: float | None = None
) -> list[DueReminder]:
    """Atomically claim up to ``limit`` reminders: those whose earlier claim was not turned
    into a turn within its deadline, then those due now. Each becomes ``firing`` with a
    deadline ``refire_seconds`` (default ``reminder_refire_seconds``) from now."""
    return _claim(store, limit, refire_seconds).reminders


def _claim(store: Store, limit: int, refire_seconds: float | None = None) -> scripts.Claimed:
    seconds = store.settings.reminder_refire_seconds if refire_seconds is None else refire_seconds
    return scripts.reminder_claim(store, limit=limit, refire_ms=int(seconds * 1000))


def poll_once(store: Store, dispatcher: Dispatcher, limit: int = 100) -> int:
    """Claim due reminders (batches of ``limit`` until none is left) and send one
    ``reminder.fire`` task each. A fire that cannot be sent is logged; its reminder is
    claimed and sent again once its deadline passes. Returns how many were claimed."""
    return poll(store, dispatcher, limit)[0]


def poll(store: Store, dispatcher: Dispatcher, limit: int = 100) -> tuple[int, float | None]:
    """``poll_once``, also answering when to poll next: ``(claimed, seconds)``, ``seconds``
    until the next reminder falls due or a claimed one's deadline passes (server clock),
    ``None`` when no reminder is armed or firing. Raises ``StoreUnavailable``."""
    claimed = 0
    while True:
        claim = _claim(store, limit)
        due = claim.reminders
        claimed += len(due)
        errors = send_all(
            dispatcher,
            [
                (
                    Task.REMINDER_FIRE,
                    [r.session_id, r.reminder_id, r.prompt],
                    work_queue(Family.REMINDER),
                )
                for r in due
            ],
        )
        for rem, error in zip(due, errors, strict=True):
            if error is not None:
                log.warning(
                    "reminder %s: fire not sent (%s: %s); it is sent again after its deadline",
                    rem.reminder_id,
                    type(error).__name__,
                    error,
                    extra={"session_id": rem.session_id, "family": "reminder"},
                )
        if len(due) < limit and claim.wait_ms != 0:
            return claimed, None if claim.wait_ms is None else claim.wait_ms / 1000


def stop_reminders(store: Store, session_id: str, reminder_ids: list[str]) -> int:
    """Delete exactly the named reminders of the session that are still armed or firing, in
    one atomic step (one fired, deleted or not the session's is left alone). Returns the
    count deleted."""
    rids = [r for r in reminder_ids if isinstance(r, str) and REMINDER_ID_RE.fullmatch(r)]
    if not rids:
        return 0
    count = scripts.reminder_stop(store, session_id=session_id, reminder_ids=rids)
    log.info(
        "deleted %d of %d named reminder(s)",
        count,
        len(rids),
        extra={"session_id": session_id, "family": "reminder"},
    )
    return count
