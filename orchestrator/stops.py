"""The stop fan-out: one stop request per family (jobs: per owning host), sent and never
awaited. Each dispatch is contained: a failure is logged as a warning and reported, and never
keeps the other families from being asked (seed 004: stops are requested, not waited for).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.activity import ActivityItem
from orchestrator.families import Dispatcher, Family, Task, control_queue

log = logging.getLogger(__name__)


@dataclass
class StopReport:
    """What the fan-out sent: ``sent`` maps a family to the number of items it was asked to
    stop; ``failed`` lists ``(family, error text)`` for dispatches that could not be sent."""

    sent: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)


def _send(
    dispatcher: Dispatcher,
    report: StopReport,
    family: Family,
    task: str,
    args: list[object],
    queue: str,
    count: int,
    session_id: str,
) -> None:
    try:
        dispatcher.send(task, list(args), queue)
    except Exception as exc:  # contained on purpose: one family must not block another
        report.failed.append((family.value, f"{type(exc).__name__}: {exc}"))
        log.warning(
            "stop dispatch for %s failed: %s: %s",
            family.value,
            type(exc).__name__,
            exc,
            extra={"session_id": session_id, "family": family.value},
        )
        return
    report.sent[family.value] = report.sent.get(family.value, 0) + count


def job_stop_batches(items: list[ActivityItem]) -> dict[str, list[ActivityItem]]:
    """Group job items by the queue their stop must go to (the owning host's, or the shared
    one for jobs no worker has taken yet)."""
    by_queue: dict[str, list[ActivityItem]] = defaultdict(list)
    for item in items:
        by_queue[control_queue(Family.JOB, item.host)].append(item)
    return dict(by_queue)


def dispatch_stops(
    dispatcher: Dispatcher, session_id: str, items: list[ActivityItem]
) -> StopReport:
    """Ask each family with live items to stop them. Returns once every request is sent (or
    failed); never raises for a dispatch failure."""
    report = StopReport()
    by_family: dict[Family, list[ActivityItem]] = defaultdict(list)
    for item in items:
        by_family[item.family].append(item)
    turns = by_family.get(Family.TURN, [])
    if turns:
        _send(
            dispatcher,
            report,
            Family.TURN,
            Task.TURN_STOP,
            [session_id, [t.id for t in turns]],
            control_queue(Family.TURN),
            len(turns),
            session_id,
        )
    for queue, jobs in job_stop_batches(by_family.get(Family.JOB, [])).items():
        _send(
            dispatcher,
            report,
            Family.JOB,
            Task.JOB_STOP,
            [session_id, [j.id for j in jobs]],
            queue,
            len(jobs),
            session_id,
        )
    subagents = by_family.get(Family.SUBAGENT, [])
    if subagents:
        _send(
            dispatcher,
            report,
            Family.SUBAGENT,
            Task.SUBAGENT_STOP,
            [session_id, [s.id for s in subagents]],
            control_queue(Family.SUBAGENT),
            len(subagents),
            session_id,
        )
    reminders = by_family.get(Family.REMINDER, [])
    if reminders:
        _send(
            dispatcher,
            report,
            Family.REMINDER,
            Task.REMINDER_STOP,
            [session_id],
            control_queue(Family.REMINDER),
            len(reminders),
            session_id,
        )
    return report
