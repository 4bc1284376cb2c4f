"""The stop fan-out: one stop request per family (jobs: per owning host), sent and never
awaited. Each dispatch is contained: a failure is logged as a warning and reported, and never
keeps the other families from being asked (stops are requested, not waited for).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import families
from orchestrator.families import Dispatcher, FamilySpec, send_all
from orchestrator.families.subagent import subagent_plan
from orchestrator.items import ActivityItem
from orchestrator.storage import metrics
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


@dataclass
class StopReport:
    """What the fan-out sent: ``sent`` maps a family to the number of items it was asked to
    stop; ``failed`` lists ``(family, error text)`` for dispatches that could not be sent."""

    sent: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)
    #: The metric increments the dispatches make (``fleet_stop_dispatches`` and
    #: ``fleet_stop_failures`` by family, one per message), for ``metrics.incr_into``.
    counts: list[tuple[metrics.Counter, tuple[str, ...], int]] = field(
        default_factory=list, repr=False
    )


#: One stop message's worth of items: the family, its queue, the items by session.
_Group = tuple[FamilySpec, str, dict[str, list[ActivityItem]]]

__all__ = [
    "StopMessage",
    "StopReport",
    "dispatch_stops",
    "dispatch_stops_many",
    "stop_messages",
    "stop_messages_many",
    "subagent_plan",
]


@dataclass(frozen=True)
class StopMessage:
    """One stop request: the ``family`` it stops, how many items (``count``), and the task
    name, arguments and queue it is sent as."""

    family: str
    count: int
    task: str
    args: list[Any]
    queue: str


def _groups(items_by_session: dict[str, list[ActivityItem]]) -> list[_Group]:
    """Items grouped by (family, stop queue), in registry order, then by session. Raises
    ``UnknownFamily`` for an item of no registered family (it is never sent elsewhere)."""
    grouped: dict[tuple[str, str], dict[str, list[ActivityItem]]] = {}
    for sid, items in items_by_session.items():
        for item in items:
            spec = families.get(item.family)
            group = grouped.setdefault((spec.name, spec.stop_queue(item)), {})
            group.setdefault(sid, []).append(item)
    order = {name: i for i, name in enumerate(families.names())}
    keys = sorted(grouped, key=lambda key: order[key[0]])  # stable: queues keep their order
    return [(families.get(name), queue, grouped[(name, queue)]) for name, queue in keys]


def stop_messages(session_id: str, items: list[ActivityItem]) -> list[StopMessage]:
    """The stop requests for ``items``: one per family (``FamilySpec.stop_task``, arguments
    ``[sessionId, payload]``), and one per owning host for families whose stops go to the
    host. Raises ``UnknownFamily`` for an item of no registered family."""
    return [
        StopMessage(spec.name, len(mine), spec.stop_task, [session_id, spec.payload(mine)], queue)
        for spec, queue, by_session in _groups({session_id: items})
        for mine in by_session.values()
    ]


def dispatch_stops(
    dispatcher: Dispatcher,
    session_id: str,
    items: list[ActivityItem],
    *,
    store: Store | None = None,
) -> StopReport:
    """Ask each family with live items to stop them. The requests are sent and never awaited;
    a failed one is logged and reported, and never keeps the others from being sent. Raises
    only ``UnknownFamily``, for an item of no registered family, before anything is sent.
    Each request is counted (``fleet_stop_dispatches``/``fleet_stop_failures`` by family):
    with ``store`` in one round trip, else left in the report's ``counts`` for the caller."""
    report = StopReport()

    def failed(message: StopMessage, error: Exception) -> None:
        family = str(message.family)
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

    report.counts.extend(
        _send_counted(dispatcher, stop_messages(session_id, items), report, failed)
    )
    if store is not None:
        metrics.incr_many(store, report.counts)
    return report


def _send_counted(
    dispatcher: Dispatcher,
    messages: list[StopMessage],
    report: StopReport,
    failed: Callable[[StopMessage, Exception], None],
) -> list[tuple[metrics.Counter, tuple[str, ...], int]]:
    """Send ``messages`` (one failure never keeps the others from being sent), adding each to
    ``report`` (``sent`` by family, or ``failed`` with its error, after ``failed`` is told).
    Returns the metric increments: one ``fleet_stop_dispatches`` or ``fleet_stop_failures``
    per message, by family."""
    errors = send_all(dispatcher, [(m.task, m.args, m.queue) for m in messages])
    counts: list[tuple[metrics.Counter, tuple[str, ...], int]] = []
    for message, error in zip(messages, errors, strict=True):
        family = str(message.family)
        if error is None:
            report.sent[family] = report.sent.get(family, 0) + message.count
            counts.append((metrics.STOP_DISPATCHES, (family,), 1))
            continue
        report.failed.append((family, f"{type(error).__name__}: {error}"))
        failed(message, error)
        counts.append((metrics.STOP_FAILURES, (family,), 1))
    return counts


def stop_messages_many(items_by_session: dict[str, list[ActivityItem]]) -> list[StopMessage]:
    """The stop requests of a bulk batch: ONE message per family carrying every session of
    the batch (per owning host's queue for families whose stops go to the host), instead of
    one per session: ``FamilySpec.stop_many_task`` with ``[{sessionId: payload}]``, the
    payload of the family's single stop (ids; for subagents ``{descendantId: plan}``,
    ``subagent_plan``). Each item is keyed by the session it was found for (the archived one;
    a subagent item names the descendant and the items of it to stop). Raises
    ``UnknownFamily`` for an item of no registered family."""
    return [
        StopMessage(
            spec.name,
            sum(len(mine) for mine in by_session.values()),
            spec.stop_many_task,
            [{sid: spec.payload(mine) for sid, mine in by_session.items()}],
            queue,
        )
        for spec, queue, by_session in _groups(items_by_session)
    ]


def dispatch_stops_many(
    dispatcher: Dispatcher,
    items_by_session: dict[str, list[ActivityItem]],
    *,
    store: Store | None = None,
    report: StopReport | None = None,
) -> StopReport:
    """``dispatch_stops`` for a bulk batch: one message per family (per host for jobs) for
    all the sessions in ``items_by_session``. Never waits; raises only ``UnknownFamily``
    (before anything is sent); failures are logged and reported (added to ``report`` when given).
    The messages are counted as ``dispatch_stops`` counts them: with ``store`` in one round
    trip, else left in the report's ``counts`` for the caller."""
    report = report if report is not None else StopReport()

    def failed(message: StopMessage, error: Exception) -> None:
        family = str(message.family)
        log.warning(
            "bulk stop dispatch for %s (%d item(s) of %d session(s)) failed: %s: %s",
            family,
            message.count,
            len(items_by_session),
            type(error).__name__,
            error,
            extra={"family": family},
        )

    messages = stop_messages_many(items_by_session)
    counts = _send_counted(dispatcher, messages, report, failed)
    report.counts.extend(counts)
    if store is not None:
        metrics.incr_many(store, counts)
    return report
