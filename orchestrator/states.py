"""The states of turns, jobs and reminders and the rules over them, written once: Python
reads them from here (through ``orchestrator.turn.turns``, ``jobs`` and ``reminders``) and the Lua
scripts from the prelude ``orchestrator/storage/luarules.py`` generates from them. Imports nothing
of
the project, so the prelude's generation reaches it from the store without a cycle.
"""

from __future__ import annotations

from enum import StrEnum


class TurnState(StrEnum):
    """Where a turn is in its lifecycle."""

    QUEUED = "queued"  #: waiting behind the session's running turn
    RUNNING = "running"  #: its steps are being dispatched and run
    CANCELLING = "cancelling"  #: stopped while a step was in flight; the step settles it
    COMPLETED = "completed"  #: the model ended it (stopReason end_turn, max_tokens, ...)
    CANCELLED = "cancelled"  #: stopped by a user cancel or an archive
    BLOCKED = "blocked"  #: a step was refused by the gate; no model request was made
    FAILED = "failed"  #: the model or a tool failed


#: The moves a turn may make: from each state, the states it may go to.
TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    TurnState.QUEUED: frozenset({TurnState.RUNNING, TurnState.CANCELLED, TurnState.BLOCKED}),
    TurnState.RUNNING: frozenset(
        {
            TurnState.CANCELLING,
            TurnState.CANCELLED,
            TurnState.COMPLETED,
            TurnState.BLOCKED,
            TurnState.FAILED,
        }
    ),
    TurnState.CANCELLING: frozenset({TurnState.CANCELLED}),
    TurnState.COMPLETED: frozenset(),
    TurnState.CANCELLED: frozenset(),
    TurnState.BLOCKED: frozenset(),
    TurnState.FAILED: frozenset(),
}

#: The states of a turn not yet ended.
LIVE_STATES = frozenset({TurnState.QUEUED, TurnState.RUNNING, TurnState.CANCELLING})

#: A turn's ``cancelledBy`` when an archive of its session (or of an ancestor) stopped it
#: (written by ``stop_turns_for_archive`` in ``_lib.lua``). ACP's ``stopReason`` stays
#: ``cancelled``: this says why, for clients that show it (``fleet prompt``).
CANCELLED_BY_ARCHIVE = "archive"
#: ... when the archive was a delete's (``deletion.delete`` with ``stop_activity``).
CANCELLED_BY_DELETE = "delete"

#: ACP ``stopReason`` for each terminal state.
STOP_REASON = {
    TurnState.COMPLETED: "end_turn",
    TurnState.CANCELLED: "cancelled",
    TurnState.BLOCKED: "cancelled",
    TurnState.FAILED: "end_turn",  # the error is in the turn's last message
}


class JobState(StrEnum):
    """Where a job is in its lifecycle."""

    STARTING = "starting"  #: stored, waiting for a job worker to take it
    RUNNING = "running"  #: its process runs on ``host``
    EXITED = "exited"  #: the process ended by itself (``exitCode``)
    STOPPED = "stopped"  #: stopped on request (archive or cancel)
    REFUSED = "refused"  #: never started: its lineage was archived, or its host was full
    #: (``FLEET_MAX_JOBS_PER_HOST``), when a worker took it; ``reason`` says which
    LOST = "lost"  #: its worker vanished; the lease lapsed
    FAILED = "failed"  #: the process could not be started


class ReminderState(StrEnum):
    """Where a reminder is in its lifecycle (``orchestrator/reminder/reminders.py`` tells the
    moves)."""

    ARMED = "armed"  #: stored, waiting for its due time
    FIRING = "firing"  #: claimed by the poller, its turn not created yet
    FIRED = "fired"  #: its one turn was created (``turnId``)
    DELETED = "deleted"  #: a stop named it before it fired
    REFUSED = "refused"  #: it fell due under an archived lineage
    DROPPED = "dropped"  #: its session was deleted
