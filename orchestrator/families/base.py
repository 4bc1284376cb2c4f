"""Task names, the maintenance queue, and the dispatcher every family's messages go through."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


class Family(StrEnum):
    """The names of the built-in families (each declared by its registry entry, in
    ``orchestrator/families/<name>.py``). Code that must work for any family reads the
    registry (``orchestrator.families.registry``) instead of this list."""

    TURN = "turn"  #: a running or queued turn (a chain of model steps)
    JOB = "job"  #: a background process a session owns on some host
    SUBAGENT = "subagent"  #: a descendant session with live work, any depth
    REMINDER = "reminder"  #: a stored reminder not yet fired


class Task:
    """Dotted task names, by family and action (each family's registry entry names its own)."""

    TURN_STEP = "turn.step"
    TURN_STOP = "turn.stop"
    JOB_RUN = "job.run"
    JOB_STOP = "job.stop"
    SUBAGENT_STOP = "subagent.stop"
    REMINDER_FIRE = "reminder.fire"
    REMINDER_STOP = "reminder.stop"
    #: Bulk stops: one message for many sessions. Arguments: ``{sessionId: payload}``, the
    #: payload of the family's single stop (``FamilySpec.payload``): ids for turns, jobs and
    #: reminders; ``{descendantId: plan}`` for subagents (``families.subagent.subagent_plan``).
    #: Every stop names exactly the items it stops.
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


class Dispatcher(Protocol):
    """Sends a task by name to a queue and returns without waiting for it to run. A
    dispatcher that publishes to the broker names each message ``message_id(task, args)``
    when that is not ``None``.

    Raises whatever the transport raises when the message cannot be published; callers that
    must not fail (the archive fan-out) catch and log.
    """

    def send(self, task: str, args: list[Any], queue: str) -> None: ...


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


@runtime_checkable
class BatchDispatcher(Dispatcher, Protocol):
    """A ``Dispatcher`` that can publish several messages in one write to the broker."""

    def send_many(self, messages: list[Message]) -> list[Exception | None]:
        """Publish every ``(task, args, queue)`` message; return, per message, the error that
        kept it from being published or ``None``. Never raises."""
        ...


def step_message_id(turn_id: str, index: int) -> str:
    """The task id of every message of step ``index`` of a turn: the turn sweeper looks for
    it in the broker to tell a step waiting for a worker from a lost one
    (``orchestrator/turn/sweeper.py``; ``turn/turn_broker_scan.lua`` builds the same). Copies
    of a step share it, as a retried task keeps its id."""
    return f"{turn_id}.step.{index}"


def message_id(task: str, args: list[Any]) -> str | None:
    """The task id a dispatcher gives a message of ``task`` with ``args``: a step's
    (``step_message_id``), ``None`` (a random one) for any other."""
    if task == Task.TURN_STEP and len(args) == 3:
        return step_message_id(str(args[1]), int(args[2]))
    return None


def send_step(dispatcher: Dispatcher, session_id: str, turn_id: str, index: int) -> None:
    """Send step ``index`` of a turn to the turn queue (a real dispatcher gives it the task
    id ``step_message_id``)."""
    dispatcher.send(Task.TURN_STEP, [session_id, turn_id, index], Family.TURN.value)
