"""The stop fan-out: one stop request per family (jobs: per owning host), sent and never
awaited. Each dispatch is contained: a failure is logged as a warning and reported, and never
keeps the other families from being asked (seed 004: stops are requested, not waited for).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from orchestrator import metrics
from orchestrator.activity import ActivityItem
from orchestrator.families import Dispatcher, Family, Task, control_queue, send_all
from orchestrator.store import Store

log = logging.getLogger(__name__)


@dataclass
class StopReport:
    """What the fan-out sent: ``sent`` maps a family to the number of items it was asked to
    stop; ``failed`` lists ``(family, error text)`` for dispatches that could not be sent."""

    sent: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class StopMessage:
    """One stop request: the ``family`` it stops, how many items (``count``), and the task
    name, arguments and queue it is sent as."""

    family: Family
    count: int
    task: str
    args: list[Any]
    queue: str


def job_stop_batches(items: list[ActivityItem]) -> dict[str, list[ActivityItem]]:
    """Group job items by the queue their stop must go to (the owning host's, or the shared
    one for jobs no worker has taken yet)."""
    by_queue: dict[str, list[ActivityItem]] = defaultdict(list)
    for item in items:
        by_queue[control_queue(Family.JOB, item.host)].append(item)
    return dict(by_queue)


def subagent_plan(item: ActivityItem) -> dict[str, list[Any]]:
    """What a ``subagent`` stop does to one descendant: exactly the live items its census
    found, ``{"turns": [turnId, ...], "jobs": [[jobId, host or null], ...], "reminders":
    [reminderId, ...]}``, so a stop that arrives late touches nothing started since."""
    plan: dict[str, list[Any]] = {"turns": [], "jobs": [], "reminders": []}
    for part in item.parts:
        if part.family is Family.TURN:
            plan["turns"].append(part.id)
        elif part.family is Family.JOB:
            plan["jobs"].append([part.id, part.host])
        elif part.family is Family.REMINDER:
            plan["reminders"].append(part.id)
    return plan


def stop_messages(session_id: str, items: list[ActivityItem]) -> list[StopMessage]:
    """The stop requests for ``items``: one per family, and one per owning host for jobs."""
    by_family: dict[Family, list[ActivityItem]] = defaultdict(list)
    for item in items:
        by_family[item.family].append(item)
    out: list[StopMessage] = []
    turns = by_family.get(Family.TURN, [])
    if turns:
        out.append(
            StopMessage(
                Family.TURN,
                len(turns),
                Task.TURN_STOP,
                [session_id, [t.id for t in turns]],
                control_queue(Family.TURN),
            )
        )
    for queue, jobs in job_stop_batches(by_family.get(Family.JOB, [])).items():
        out.append(
            StopMessage(
                Family.JOB, len(jobs), Task.JOB_STOP, [session_id, [j.id for j in jobs]], queue
            )
        )
    subagents = by_family.get(Family.SUBAGENT, [])
    if subagents:
        out.append(
            StopMessage(
                Family.SUBAGENT,
                len(subagents),
                Task.SUBAGENT_STOP,
                [session_id, {a.id: subagent_plan(a) for a in subagents}],
                control_queue(Family.SUBAGENT),
            )
        )
    reminders = by_family.get(Family.REMINDER, [])
    if reminders:
        out.append(
            StopMessage(
                Family.REMINDER,
                len(reminders),
                Task.REMINDER_STOP,
                [session_id, [r.id for r in reminders]],
                control_queue(Family.REMINDER),
            )
        )
    return out


def dispatch_stops(
    dispatcher: Dispatcher,
    session_id: str,
    items: list[ActivityItem],
    *,
    store: Store | None = None,
) -> StopReport:
    """Ask each family with live items to stop them. The requests are sent and never awaited;
    a failed one is logged and reported, and never keeps the others from being sent. Never
    raises. With ``store``, each request is counted (``fleet_stop_dispatches``/
    ``fleet_stop_failures`` by family, in one round trip)."""
    report = StopReport()
    messages = stop_messages(session_id, items)
    errors = send_all(dispatcher, [(m.task, m.args, m.queue) for m in messages])
    counts: list[tuple[metrics.Counter, tuple[str, ...], int]] = []
    for message, error in zip(messages, errors, strict=True):
        family = message.family.value
        if error is None:
            report.sent[family] = report.sent.get(family, 0) + message.count
            counts.append((metrics.STOP_DISPATCHES, (family,), 1))
            continue
        report.failed.append((family, f"{type(error).__name__}: {error}"))
        extra = {"session_id": session_id, "family": family}
        # One line per failure: a broker outage fails every family at once, and a traceback
        # each would bury the archive that succeeded. The traceback is logged at debug.
        log.warning(
            "stop dispatch for %s failed: %s: %s",
            family,
            type(error).__name__,
            error,
            extra=extra,
        )
        log.debug("stop dispatch for %s failed", family, exc_info=error, extra=extra)
        counts.append((metrics.STOP_FAILURES, (family,), 1))
    if store is not None:
        metrics.incr_many(store, counts)
    return report


def stop_messages_many(items_by_session: dict[str, list[ActivityItem]]) -> list[StopMessage]:
    """The stop requests of a bulk batch: ONE message per family carrying every session of
    the batch (jobs: one per owning host's queue), instead of one per session.

    ``turn.stop_many``/``job.stop_many``/``reminder.stop_many`` take ``{sessionId: [ids]}``
    (turn, job, reminder ids); ``subagent.stop_many`` takes ``{sessionId: {descendantId:
    plan}}`` (``subagent_plan``). Each item is keyed by the session it was found for (the
    archived one; a subagent item names the descendant and the items of it to stop)."""
    turns: dict[str, list[str]] = defaultdict(list)
    jobs: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    subagents: dict[str, dict[str, dict[str, list[Any]]]] = defaultdict(dict)
    reminders: dict[str, list[str]] = defaultdict(list)
    for sid, items in items_by_session.items():
        for item in items:
            if item.family is Family.TURN:
                turns[sid].append(item.id)
            elif item.family is Family.JOB:
                jobs[control_queue(Family.JOB, item.host)][sid].append(item.id)
            elif item.family is Family.SUBAGENT:
                subagents[sid][item.id] = subagent_plan(item)
            else:
                reminders[sid].append(item.id)
    out: list[StopMessage] = []
    if turns:
        count = sum(len(v) for v in turns.values())
        out.append(
            StopMessage(
                Family.TURN, count, Task.TURN_STOP_MANY, [dict(turns)], control_queue(Family.TURN)
            )
        )
    for queue, by_session in jobs.items():
        count = sum(len(v) for v in by_session.values())
        out.append(StopMessage(Family.JOB, count, Task.JOB_STOP_MANY, [dict(by_session)], queue))
    if subagents:
        count = sum(len(v) for v in subagents.values())
        out.append(
            StopMessage(
                Family.SUBAGENT,
                count,
                Task.SUBAGENT_STOP_MANY,
                [dict(subagents)],
                control_queue(Family.SUBAGENT),
            )
        )
    if reminders:
        out.append(
            StopMessage(
                Family.REMINDER,
                sum(len(v) for v in reminders.values()),
                Task.REMINDER_STOP_MANY,
                [dict(reminders)],
                control_queue(Family.REMINDER),
            )
        )
    return out


def dispatch_stops_many(
    dispatcher: Dispatcher,
    items_by_session: dict[str, list[ActivityItem]],
    *,
    store: Store | None = None,
    report: StopReport | None = None,
) -> StopReport:
    """``dispatch_stops`` for a bulk batch: one message per family (per host for jobs) for
    all the sessions in ``items_by_session``. Never waits, never raises; failures are logged
    and reported (added to ``report`` when given)."""
    report = report if report is not None else StopReport()
    messages = stop_messages_many(items_by_session)
    errors = send_all(dispatcher, [(m.task, m.args, m.queue) for m in messages])
    for message, error in zip(messages, errors, strict=True):
        family = message.family.value
        if error is None:
            report.sent[family] = report.sent.get(family, 0) + message.count
            if store is not None:
                metrics.incr(store, metrics.STOP_DISPATCHES, family)
            continue
        report.failed.append((family, f"{type(error).__name__}: {error}"))
        log.warning(
            "bulk stop dispatch for %s (%d item(s) of %d session(s)) failed: %s: %s",
            family,
            message.count,
            len(items_by_session),
            type(error).__name__,
            error,
            extra={"family": family},
        )
        if store is not None:
            metrics.incr(store, metrics.STOP_FAILURES, family)
    return report
