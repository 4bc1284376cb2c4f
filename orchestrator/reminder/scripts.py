"""The reminder package's door to Redis: one typed function per Lua script beside it
(``reminder_create.lua``, ``reminder_claim.lua``, ``reminder_stop.lua``).

Only this module builds those scripts' ARGV and reads their replies; the rest of the code calls
these functions with keyword arguments and gets typed values back. Every function raises
``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.session.fencing import StepGuard
from orchestrator.session.scripts import AtLimit as AtLimit
from orchestrator.session.scripts import GuardLost as GuardLost
from orchestrator.session.scripts import launch_refusal
from orchestrator.storage.store import Store


@dataclass(frozen=True)
class Armed:
    """``reminder_create``: the reminder is stored, due at ``due_ms`` (epoch ms, Redis clock)."""

    due_ms: int


@dataclass(frozen=True)
class DueReminder:
    """A reminder claimed by ``reminder_claim``: its id, session and prompt."""

    reminder_id: str
    session_id: str
    prompt: str


def reminder_create(
    store: Store,
    *,
    reminder_id: str,
    session_id: str,
    prompt: str,
    label: str,
    delay_ms: int,
    due_at: str,
    created_at: str,
    guard: StepGuard | None,
    max_live: int,
) -> Armed | GuardLost | AtLimit:
    """Arm a reminder ``delay_ms`` after now on the server's clock, unless ``guard`` (the step
    asking for it) no longer holds its step or the session has ``max_live`` live reminders.
    ``due_at`` and ``created_at`` are ISO 8601 texts stored on the record."""
    reply = store.run(
        "reminder_create",
        [
            reminder_id,
            session_id,
            prompt,
            label,
            delay_ms,
            due_at,
            created_at,
            *StepGuard.argv(guard),
            max_live,
        ],
    )
    refused = launch_refusal(reply)
    if refused is not None:
        return refused
    return Armed(int(reply))


@dataclass(frozen=True)
class Claimed:
    """``reminder_claim``: the ``reminders`` claimed, and ``wait_ms``: the ms (server clock)
    until the next reminder falls due or the next claimed one's deadline passes (0: more are
    due now), ``None`` when no reminder is armed or firing."""

    reminders: list[DueReminder]
    wait_ms: int | None


def reminder_claim(store: Store, *, limit: int, refire_ms: int) -> Claimed:
    """Claim up to ``limit`` reminders at once: those whose fire was not confirmed by their
    deadline first, then due ones. Each becomes ``firing`` with a deadline ``refire_ms`` from
    now (doubled at each re-claim, up to 8x)."""
    wait, *flat = store.run("reminder_claim", [limit, refire_ms])
    due = [DueReminder(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
    return Claimed(due, None if int(wait) < 0 else int(wait))


def reminder_stop(store: Store, *, session_id: str, reminder_ids: list[str]) -> int:
    """Delete exactly the named reminders of ``session_id`` still armed or firing; returns how
    many were deleted."""
    return int(store.run("reminder_stop", [session_id, *reminder_ids]))
