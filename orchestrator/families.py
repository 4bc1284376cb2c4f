"""The four activity families and the names of their tasks and queues.

The orchestrator speaks to workers by task name and queue name only (``Dispatcher``), so the
API process never imports task code. Queue layout, per family:

- ``turn``: turn steps; ``turn.ctl``: turn stops.
- ``job``: job starts, taken by any job worker; ``job.ctl``: stops for jobs no worker has taken
  yet; ``job.ctl.<host>``: stops for jobs running on ``<host>``, consumed only by that host's
  job worker, so a stop reaches exactly the host that owns the process.
- ``subagent.ctl``: subagent stops. ``reminder``: reminder firings; ``reminder.ctl``: stops.
- ``maintenance``: scheduled fleet-wide tasks (``archive.auto``), consumed by reminder workers.

Bulk operations send one stop per family per batch (``*.stop_many``, jobs: per host queue)
carrying many sessions, instead of one message per session.

Control queues are separate from work queues and listed first by every worker, so a stop never
waits behind queued work.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


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
    #: Bulk stops: one message for many sessions. Arguments: ``{sessionId: [ids]}`` (turns,
    #: jobs, reminders); subagents: ``{sessionId: {descendantId: plan}}``
    #: (``stops.subagent_plan``). Every stop names exactly the items it stops.
    TURN_STOP_MANY = "turn.stop_many"
    JOB_STOP_MANY = "job.stop_many"
    SUBAGENT_STOP_MANY = "subagent.stop_many"
    REMINDER_STOP_MANY = "reminder.stop_many"
    #: The auto-archive policy (scheduled by ``fleet beat`` on ``MAINTENANCE_QUEUE``).
    ARCHIVE_AUTO = "archive.auto"
    #: The archive reconciler (scheduled by ``fleet beat`` on ``MAINTENANCE_QUEUE``).
    ARCHIVE_RECONCILE = "archive.reconcile"


#: Queue of scheduled fleet-wide tasks; reminder workers consume it.
MAINTENANCE_QUEUE = "maintenance"


def work_queue(family: Family) -> str:
    """The queue a family's work goes to (``turn``, ``job``, ...)."""
    return str(family)


def control_queue(family: Family, host: str | None = None) -> str:
    """The queue a family's stops go to; job stops for a known host go to that host's."""
    if family is Family.JOB and host:
        return f"job.ctl.{host}"
    return f"{family}.ctl"


#: One message for a worker: ``(task name, positional args, queue)``.
Message = tuple[str, list[Any], str]


def send_all(dispatcher: Dispatcher, messages: list[Message]) -> list[Exception | None]:
    """Send ``(task, args, queue)`` messages; return, per message, the error that kept it from
    being sent or ``None``. One failure never stops the others. A ``BatchDispatcher`` publishes
    them in one pipelined write; any other dispatcher sends them one after another."""
    if isinstance(dispatcher, BatchDispatcher):
        return dispatcher.send_many(messages)
    errors: list[Exception | None] = []
    for task, args, queue in messages:
        try:
            dispatcher.send(task, args, queue)
            errors.append(None)
        except Exception as exc:  # contained: reported to the caller per message
            errors.append(exc)
    return errors


def send_step(dispatcher: Dispatcher, session_id: str, turn_id: str, index: int) -> None:
    """Send step ``index`` of a turn to the turn queue."""
    dispatcher.send(Task.TURN_STEP, [session_id, turn_id, index], work_queue(Family.TURN))


class Dispatcher(Protocol):
    """Sends a task by name to a queue and returns without waiting for it to run.

    Raises whatever the transport raises when the message cannot be published; callers that
    must not fail (the archive fan-out) catch and log.
    """

    def send(self, task: str, args: list[Any], queue: str) -> None: ...


@runtime_checkable
class BatchDispatcher(Dispatcher, Protocol):
    """A ``Dispatcher`` that can publish several messages in one write to the broker."""

    def send_many(self, messages: list[Message]) -> list[Exception | None]:
        """Publish every ``(task, args, queue)`` message; return, per message, the error that
        kept it from being published or ``None``. Never raises."""
        ...
