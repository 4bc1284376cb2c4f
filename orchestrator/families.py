"""The four activity families and the names of their tasks and queues.

The orchestrator speaks to workers by task name and queue name only (``Dispatcher``), so the
API process never imports task code. Queue layout, per family:

- ``turn``: turn steps; ``turn.ctl``: turn stops.
- ``job``: job starts, taken by any job worker; ``job.ctl``: stops for jobs no worker has taken
  yet; ``job.ctl.<host>``: stops for jobs running on ``<host>``, consumed only by that host's
  job worker, so a stop reaches exactly the host that owns the process.
- ``subagent.ctl``: subagent stops. ``reminder``: reminder firings; ``reminder.ctl``: stops.

Control queues are separate from work queues and listed first by every worker, so a stop never
waits behind queued work.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol


class Family(StrEnum):
    """An activity family: what kind of live work an item is."""

    TURN = "turn"  #: a running or queued turn (a chain of model steps)
    JOB = "job"  #: a background process a session owns on some host
    SUBAGENT = "subagent"  #: a descendant session with live work, any depth
    REMINDER = "reminder"  #: a stored reminder not yet fired


class Task:
    """Dotted task names, by family and action."""

    TURN_STEP = "turn.step"
    TURN_STOP = "turn.stop"
    JOB_RUN = "job.run"
    JOB_STOP = "job.stop"
    SUBAGENT_STOP = "subagent.stop"
    REMINDER_FIRE = "reminder.fire"
    REMINDER_STOP = "reminder.stop"


def work_queue(family: Family) -> str:
    """The queue a family's work goes to (``turn``, ``job``, ...)."""
    return str(family)


def control_queue(family: Family, host: str | None = None) -> str:
    """The queue a family's stops go to; job stops for a known host go to that host's."""
    if family is Family.JOB and host:
        return f"job.ctl.{host}"
    return f"{family}.ctl"


def send_step(dispatcher: Dispatcher, session_id: str, turn_id: str, index: int) -> None:
    """Send step ``index`` of a turn to the turn queue."""
    dispatcher.send(Task.TURN_STEP, [session_id, turn_id, index], work_queue(Family.TURN))


class Dispatcher(Protocol):
    """Sends a task by name to a queue and returns without waiting for it to run.

    Raises whatever the transport raises when the message cannot be published; callers that
    must not fail (the archive fan-out) catch and log.
    """

    def send(self, task: str, args: list[Any], queue: str) -> None: ...
