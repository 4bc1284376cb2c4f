"""The one archive transition's driver: ``ArchiveRun`` runs ``archiving/archive.lua`` over a
batch of sessions (one for ``archive.archive``, many for ``bulk``), re-checks refusals whose
census came back empty, sends the stops and records what the script did not
(``docs/decisions/one-archive-transition.md``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.archiving import scripts
from orchestrator.archiving.bulk_result import BulkItem
from orchestrator.archiving.stops import StopReport, dispatch_stops, dispatch_stops_many
from orchestrator.census.activity import (
    ActivityItem,
    census_many,
    census_of_rows,
    mark_quiet,
    merge_items,
)
from orchestrator.families import Dispatcher
from orchestrator.session.sessions import SESSION_ID_RE
from orchestrator.storage import audit, bookkeeping, events, metrics
from orchestrator.storage.store import Store, new_id
from orchestrator.turn.turns import CANCELLED_BY_ARCHIVE, stopped_by_archive

log = logging.getLogger(__name__)

#: How often a refusal is re-checked when the census found nothing (the work ended between
#: the atomic check and the census read).
REFUSAL_RECHECKS = 3
#: The most items a confirmation may name (a census is far smaller; this bounds the input).
MAX_CONFIRMED = 10_000

#: What a confirmation names: (family, id) pairs as ``ActivityItem`` gives them.
Confirmed = list[tuple[str, str]]
#: Runs a piece of best-effort bookkeeping later, off the caller's path: given a function
#: that queues its writes on a redis-py pipeline (``bookkeeping.Bookkeeper.submit``).
Defer = Callable[[bookkeeping.Fill], object]

#: ``archive.lua``'s outcomes as the audit trail and ``fleet_archives`` name them, for those
#: the script records itself.
_FROM_SCRIPT = {
    "archived": "archived",
    "already": "already_archived",
    "not_found": "not_found",
    "skipped": "skipped",
}
#: Outcomes whose busy sessions the census reads after the write, with ``stopActivity``.
_STOPPED = frozenset({"archived", "already_archived"})

#: Outcomes ``archive.lua`` records (audit entry and count) in the script that writes them,
#: so they commit with it; the others (refusals) are recorded afterwards.
_RECORDED_IN_SCRIPT = frozenset({"archived", "already_archived", "skipped"})


@dataclass
class ArchiveResult:
    """Outcome of ``archive``: ``outcome`` is ``archived`` or ``already_archived``;
    ``archived_count`` the sessions this transition archived (the subtree); ``stopped`` the
    items stop requests were sent for; ``stop_report`` what the fan-out sent or failed."""

    session_id: str
    outcome: str
    archived_count: int = 0
    stopped: list[ActivityItem] = field(default_factory=list)
    stop_report: StopReport = field(default_factory=StopReport)
    #: The transition the session is archived by (this archive's, or the earlier one an
    #: ``already_archived`` found): what a delete waiting on the archive binds to.
    txn: str = ""

    def to_wire(self) -> dict[str, Any]:
        """JSON shape used by the REST API and the CLI."""
        return {
            "sessionId": self.session_id,
            "outcome": self.outcome,
            "archivedCount": self.archived_count,
            "stopped": [item.to_wire() for item in self.stopped],
            "stopDispatch": {
                "sent": self.stop_report.sent,
                "failed": [{"family": f, "error": e} for f, e in self.stop_report.failed],
            },
        }


@dataclass
class ArchiveRun:
    """The archive transition of a list of sessions, one ``archive.lua`` batch at a time: what
    a single archive (a batch of one) and a bulk archive share. ``batch`` writes a batch and
    answers one ``BulkItem`` per session; ``finish`` then sends the stops of its busy
    sessions and records its refusals.

    What differs per call: ``single`` (a single archive) sends one stop message per family of
    its session (``dispatch_stops``) instead of one per family for the whole batch
    (``dispatch_stops_many``), and has its script write its audit entries straight into the
    trails instead of holding them in the batch's hash; ``binding`` (a single archive with
    confirmed items) refuses a session with live work beyond it; ``defer`` writes the stop
    bookkeeping off the caller's path."""

    store: Store
    dispatcher: Dispatcher
    stop: bool
    dry: bool
    describe_refused: bool
    action: str
    #: Outcomes counted and added to the audit trail (the auto policy records only what it
    #: archived: a busy session would otherwise be recorded as refused on every run).
    recorded: tuple[str, ...] = ("archived", "already_archived", "refused")
    idle_before: int | None = None
    with_unarchive: bool = False
    #: '' or the JSON array of 'family:id' strings the user confirmed stopping.
    binding: str = ""
    #: What the turns it stops record as ``cancelledBy``.
    cause: str = CANCELLED_BY_ARCHIVE
    single: bool = False
    defer: Defer | None = None
    virtual: set[str] = field(default_factory=set)
    report: StopReport = field(default_factory=StopReport)
    #: sid -> (sessions its transition archived, the transition it is archived by), for the
    #: sessions the script described (every one of a batch of one).
    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: sid -> the items stop requests were sent for.
    stopped: dict[str, list[ActivityItem]] = field(default_factory=dict)
    #: Sessions refused because live work went beyond ``binding``.
    changed: set[str] = field(default_factory=set)

    def script(self, ids: list[str]) -> scripts.ArchiveReply:
        """One ``archive.lua`` batch of ``ids`` with this run's settings, in a transition of
        its own (``scripts.archive``)."""
        return scripts.archive(
            self.store,
            session_ids=ids,
            stop_activity=self.stop,
            dry_run=self.dry,
            txn_base=new_id("arc"),
            idle_before_ms=self.idle_before,
            with_unarchive=self.with_unarchive,
            record=self.in_script_record(),
            confirmed=self.binding,
        )

    def in_script_record(self) -> str:
        """What ``archive.lua`` records with the batch it writes (JSON): the audit entry and
        the ``fleet_archives`` count of each session it archives or finds archived (``straight``
        into the trails for a single archive), and with ``stopActivity`` the quiet histogram it
        observes."""
        extra: dict[str, Any] = {"straight": True} if self.single else {}
        if self.stop:
            histogram = metrics.ARCHIVE_QUIET
            bounds = [*histogram.buckets]
            extra["quiet"] = {
                "key": self.store.keys.metric(histogram.name),
                "bounds": bounds,
                "fields": [metrics.bucket_field(b) for b in bounds] + ["le=+Inf"],
            }
        return audit.script_recorder(
            self.store,
            self.action,
            {"stopActivity": self.stop},
            outcomes={
                script: wire
                for script, wire in _FROM_SCRIPT.items()
                if wire in self.recorded and wire in _RECORDED_IN_SCRIPT
            },
            metric=self.store.keys.metric(metrics.ARCHIVES.name),
            eventsMax=events.STREAM_MAXLEN,
            cancelledBy=self.cause,
            **extra,
        )

    def batch(self, ids: list[str]) -> tuple[list[BulkItem], Callable[[], None]]:
        """Write one batch; returns its items in the order of ``ids`` and what is left to do
        once it is written: read the census of its busy sessions, send their stops and record
        the batch (``finish``, which a bulk runs while the next batch is written)."""
        done: dict[str, BulkItem] = {}
        pending: list[str] = []
        for sid in ids:
            if not SESSION_ID_RE.fullmatch(sid):
                done[sid] = BulkItem(sid, "not_found")
            elif sid in self.virtual:  # a dry run archived it with an earlier batch's ancestor
                done[sid] = BulkItem(sid, "already_archived")
            else:
                pending.append(sid)
        busy: dict[str, list[Any]] = {}
        flipped: dict[str, list[ActivityItem]] = {}
        for attempt in range(REFUSAL_RECHECKS):
            if not pending:
                break
            active: list[str] = []
            reply = self.script(pending)
            rows: dict[str, list[Any]] = {}
            for at, said in reply.described.items():
                sid = pending[at]
                self.virtual.update(said.would)
                if said.turns:  # stopped (and their events emitted) by the script itself
                    flipped[sid] = stopped_by_archive(self.store, sid, said.turns, publish=False)
                rows[sid] = said.census
                self.answers[sid] = (said.count, said.txn)
            for sid, code in zip(pending, reply.codes, strict=True):
                outcome = code.outcome.value
                if outcome in ("active", "changed"):
                    active.append(sid)
                    continue
                done[sid] = BulkItem(sid, outcome)
                if code.live and self.stop and outcome in _STOPPED and not self.dry:
                    busy[sid] = rows[sid]
            pending = []
            if not active:
                break
            if not self.describe_refused:
                done.update((sid, BulkItem(sid, "refused")) for sid in active)
                break
            last = attempt == REFUSAL_RECHECKS - 1
            found = census_many(
                self.store, active, None if self.dry else self.dispatcher, settle=not self.dry
            )
            for sid in active:
                if self.binding:
                    refused = _unconfirmed(found[sid], self.binding)
                else:
                    refused = bool(found[sid])
                if refused or last:
                    done[sid] = BulkItem(sid, "refused", found[sid])
                    if self.binding:
                        self.changed.add(sid)
                else:
                    pending.append(sid)  # the work ended meanwhile: try the archive again
        items = [done[sid] for sid in ids]
        return items, lambda: self.finish(items, busy, flipped)

    def finish(
        self,
        items: list[BulkItem],
        busy: dict[str, list[Any]],
        flipped: dict[str, list[ActivityItem]],
    ) -> None:
        """After a batch's write: stop the live work of its ``busy`` sessions (sid -> the
        census rows its script read right after the write, in the same atomic step: anything
        that started before the write is in them, anything after it is refused by the gate,
        and work created after an unarchive that came since is not; ``flipped``: the turns its
        script stopped), then record its refusals. A busy session whose census finds nothing
        once stale records are settled is recorded quiet here (the script records the others).
        Every session the batch archived, descendants included, already got its event (ACP's
        session_info_update) from the script."""
        if self.dry:
            return
        if busy:
            stops = {
                sid: census_of_rows(self.store, sid, flat, self.dispatcher)
                for sid, flat in busy.items()
            }
            for sid, items_ in stops.items():
                if not items_:
                    mark_quiet(self.store, sid)
            for sid, stopped in flipped.items():
                stops[sid] = merge_items(stopped, stops.get(sid, []))
            sent = {sid: found for sid, found in stops.items() if found}
            self.stopped.update(sent)
            self.send_stops(sent)
        self.record(items)

    def send_stops(self, sent: dict[str, list[ActivityItem]]) -> None:
        """Send the stops of ``sent`` (sid -> items), then count them and add to the audit
        trail, per session, what was sent as a ``stop`` entry (outcome ``sent``, or
        ``partial`` when a family's dispatch failed; detail ``{stopped, families,
        stopFailures}``), both in one pipelined round trip (best effort, like the fan-out: a
        failure is logged; ``bookkeeping.write``), through ``defer`` when given. The entry's
        time is when it is written (the server's clock), so it sorts by time as by id with the
        entries around it."""
        if not sent:
            return
        if self.single:
            counts: list[tuple[metrics.Counter, tuple[str, ...], int]] = []
            failed: list[tuple[str, str]] = []
            for sid, found in sent.items():
                report = dispatch_stops(self.dispatcher, sid, found)
                counts.extend(report.counts)
                failed.extend(report.failed)
                for family, n in report.sent.items():
                    self.report.sent[family] = self.report.sent.get(family, 0) + n
                self.report.failed.extend(report.failed)
        else:
            report = dispatch_stops_many(self.dispatcher, sent, report=StopReport())
            for family, n in report.sent.items():
                self.report.sent[family] = self.report.sent.get(family, 0) + n
            self.report.failed.extend(report.failed)
            failed, counts = report.failed, report.counts
        entries: list[tuple[str, str, str, dict[str, Any]]] = []
        for sid, found in sent.items():
            families = sorted({str(item.family) for item in found})
            failures = [family for family, _ in failed if family in families]
            detail = {"stopped": len(found), "families": families, "stopFailures": failures}
            entries.append((sid, "stop", "partial" if failures else "sent", detail))
        actor = audit.current_actor()

        def fill(pipe: Any) -> None:
            metrics.incr_into(pipe, self.store, counts)
            audit.record_into(pipe, self.store, entries, actor=actor)

        if self.defer is None:
            bookkeeping.write(self.store, [fill])
        else:
            self.defer(fill)

    def record(self, items: list[BulkItem]) -> None:
        """Count the batch's refusals and add them to the audit trail (best effort; what the
        script wrote, ``_RECORDED_IN_SCRIPT``, it recorded itself): outcome ``refused``, or
        ``changed`` for live work beyond ``binding``; detail ``{stopActivity, families,
        items}``."""
        items = [item for item in items if item.outcome not in _RECORDED_IN_SCRIPT]
        if not items:
            return
        outcomes = Counter(item.outcome for item in items if item.outcome != "not_found")
        families = Counter(
            str(family)
            for item in items
            for family in {a.family for a in item.activity or []}
            if item.outcome == "refused" and "refused" in self.recorded
        )
        metrics.incr_many(
            self.store,
            [
                (metrics.ARCHIVES, (outcome,), n)
                for outcome, n in outcomes.items()
                if outcome in self.recorded
            ]
            + [(metrics.ARCHIVE_REFUSALS, (family,), n) for family, n in families.items()],
        )
        audit.record_many(
            self.store,
            [
                (
                    item.session_id,
                    self.action,
                    "changed" if item.session_id in self.changed else item.outcome,
                    {
                        "stopActivity": self.stop,
                        "families": sorted({str(a.family) for a in item.activity or []}),
                        "items": len(item.activity or []),
                    },
                )
                for item in items
                if item.outcome in self.recorded
            ],
        )


def _unconfirmed(items: list[ActivityItem], binding: str) -> bool:
    """Whether the census names an item the binding does not (as the script decided)."""
    confirmed = set(json.loads(binding)) if binding else set()
    return any(f"{item.family}:{item.id}" not in confirmed for item in items)
