"""Bulk archive: many sessions in one request, and the auto-archive policy built on it.

A bulk archive names sessions (at most ``MAX_IDS``) or selects them with a filter
(``orchestrator/bulk_select.py``: cwd, last activity older than ``idleSince``, a title
search; at most ``FLEET_BULK_FILTER_MAX``), then archives them in batches of
``BATCH_SIZE``. Each session gets what ``archive.archive`` gives one session (the same
live-work check and subtree transition, written atomically by
``scripts/bulk_archive.lua``), so the outcome of a bulk request is the outcome of that many
single archives run in order:

- ``archived``, ``already_archived``, ``not_found``;
- ``refused``: live work and no ``stopActivity``, with the live items (``activity``);
- ``skipped``: selected by ``idleSince`` (or the auto policy's age) but active again by the
  time its batch was written.

It scales by batching every round trip: one Lua script per batch writes the flags, says
which sessions have live work and, with ``stopActivity``, reads the census of those in the same
atomic step (a refused one is described by ``census_many`` after it, pipelined); with
``stopActivity`` ONE stop message per family per batch carries all the batch's sessions
(``*.stop_many``; jobs: one per owning host's queue). A batch of idle sessions costs a
constant number of round trips. Stops are never awaited; a failed dispatch is logged and
reported, never undoes an archive. ``dryRun`` computes the same outcomes and writes nothing.

The audit entry and ``fleet_archives`` count of every session a batch archives or finds
archived (the entry also in the trail of each descendant it archives), and the events of every
session it archives (descendants included) and of every turn it stops, commit with the batch,
in its script: a process killed mid-run leaves no archive unaudited, uncounted or unannounced.
Refusals are recorded after the census that describes them.

A filter's selection is archived ancestors first (by lineage depth, then oldest activity
first), so a selected subtree is archived in its root's transition and restored with it.

The auto-archive policy (``auto_archive``) archives sessions whose idle clock,
max(``updatedAt``, ``unarchivedAt``), is older than the given idle age (``fleet beat
--idle-seconds``) and
that have no live work (it never stops anything: busy sessions are refused and left alone).
The clock is checked again in the script that writes, so a session unarchived by hand while a
run was under way is not archived again.
"""

from __future__ import annotations

import contextvars
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator import audit, events, metrics
from orchestrator.activity import ActivityItem, census_many, census_of_rows, merge_items
from orchestrator.bulk_result import OUTCOMES, BulkItem, BulkResult
from orchestrator.bulk_select import (
    BulkFilter,
    auto_candidates,
    parse_instant,
    roots_first,
    select,
    write_order,
)
from orchestrator.errors import InvalidParams, TooManySessions
from orchestrator.families import Dispatcher
from orchestrator.sessions import SESSION_ID_RE
from orchestrator.stops import StopReport, dispatch_stops_many
from orchestrator.store import Store, new_id
from orchestrator.turns import stopped_by_archive

log = logging.getLogger(__name__)

__all__ = [
    "OUTCOMES",
    "BulkFilter",
    "BulkItem",
    "BulkResult",
    "auto_archive",
    "auto_candidates",
    "bulk_archive",
    "parse_instant",
    "roots_first",
    "select",
    "write_order",
]

#: Most session ids one bulk request may name.
MAX_IDS = 10_000
#: Sessions per batch: one Lua script, one census round, one stop message per family.
BATCH_SIZE = 1_000
#: How often a refusal whose census found nothing is tried again (as ``archive.archive``).
_REFUSAL_RECHECKS = 3

_FROM_SCRIPT = {
    "archived": "archived",
    "already": "already_archived",
    "not_found": "not_found",
    "skipped": "skipped",
}
#: ``bulk_archive.lua``'s one-letter outcomes (upper case: the subtree has live work).
_CODES = {
    "a": "archived",
    "l": "already_archived",
    "n": "not_found",
    "s": "skipped",
    "x": "active",
}
#: Outcomes whose busy sessions the census reads after the write, with ``stopActivity``.
_STOPPED = frozenset({"archived", "already_archived"})

#: Outcomes ``bulk_archive.lua`` records (audit entry and count) in the script that writes
#: them, so they commit with the batch; the others (refusals) are recorded afterwards.
_RECORDED_IN_SCRIPT = frozenset({"archived", "already_archived", "skipped"})

#: ``progress(done_sessions, total_sessions)``; called once before the first batch and after
#: each batch.
Progress = Callable[[int, int], None]


# -- archiving ----------------------------------------------------------------------------------
@dataclass
class _Run:
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
    virtual: set[str] = field(default_factory=set)
    report: StopReport = field(default_factory=StopReport)

    def script(self, ids: list[str]) -> tuple[str, list[Any]]:
        argv: list[Any] = [
            "1" if self.stop else "0",
            "1" if self.dry else "0",
            "",  # the script reads the server's clock: its times are its commit's, no TIME trip
            new_id("arc"),
            "" if self.idle_before is None else self.idle_before,
            "1" if self.with_unarchive else "0",
            self.in_script_record(),
            *ids,
        ]
        codes, extras = self.store.run("bulk_archive", argv, durable=not self.dry)
        return str(codes), list(extras)

    def in_script_record(self) -> str:
        """What ``bulk_archive.lua`` records with the batch it writes (JSON): the audit entry
        and the ``fleet_archives`` count of each session it archives or finds archived."""
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
        )

    def batch(self, ids: list[str]) -> tuple[list[BulkItem], Callable[[], None]]:
        """Write one batch; returns its items in the order of ``ids`` and what is left to do
        once it is written: read the census of its busy sessions, send their stops and record
        the batch (``finish``; ``_run`` runs it while the next batch is written)."""
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
        for attempt in range(_REFUSAL_RECHECKS):
            if not pending:
                break
            active: list[str] = []
            codes, extras = self.script(pending)
            rows: dict[str, list[Any]] = {}
            for pos in range(0, len(extras), 4):
                sid = pending[int(extras[pos]) - 1]
                self.virtual.update(map(str, extras[pos + 1]))
                if extras[pos + 2]:  # stopped (and their events emitted) by the script itself
                    flipped[sid] = stopped_by_archive(
                        self.store, sid, list(extras[pos + 2]), publish=False
                    )
                rows[sid] = list(extras[pos + 3])
            for sid, code in zip(pending, str(codes), strict=True):
                outcome = _CODES[code.lower()]
                if outcome == "active":
                    active.append(sid)
                    continue
                done[sid] = BulkItem(sid, outcome)
                if code.isupper() and self.stop and outcome in _STOPPED and not self.dry:
                    busy[sid] = rows[sid]
            pending = []
            if not active:
                break
            if not self.describe_refused:
                done.update((sid, BulkItem(sid, "refused")) for sid in active)
                break
            last = attempt == _REFUSAL_RECHECKS - 1
            found = census_many(
                self.store, active, None if self.dry else self.dispatcher, settle=not self.dry
            )
            for sid in active:
                if found[sid] or last:
                    done[sid] = BulkItem(sid, "refused", found[sid])
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
        census rows its script read right after the write, in the same atomic step, as a
        single archive reads them: anything that started before the write is in them, anything
        after it is refused by the gate, and work created after an unarchive that came since
        is not; ``flipped``: the turns its script stopped), then record its refusals. Every
        session the batch archived, descendants included, already got its event (ACP's
        session_info_update) from the script."""
        if self.dry:
            return
        if busy:
            stops = {
                sid: census_of_rows(self.store, sid, flat, self.dispatcher)
                for sid, flat in busy.items()
            }
            for sid, stopped in flipped.items():
                stops[sid] = merge_items(stopped, stops.get(sid, []))
            sent = {sid: items for sid, items in stops.items() if items}
            dispatch_stops_many(self.dispatcher, sent, store=self.store, report=self.report)
            self.record_stops(sent)
        self.record(items)

    def record_stops(self, sent: dict[str, list[ActivityItem]]) -> None:
        """Add to the audit trail, per session archived with ``stopActivity``, the items stop
        requests were sent for (``stop_sent``, ``{items, families}``; best effort): the
        archive's own entry commits with its write, before the census that finds them."""
        audit.record_many(
            self.store,
            [
                (
                    sid,
                    self.action,
                    "stop_sent",
                    {"items": len(items), "families": sorted({str(i.family) for i in items})},
                )
                for sid, items in sent.items()
            ],
        )

    def record(self, items: list[BulkItem]) -> None:
        """Count the batch's refusals and add them to the audit trail (best effort; what the
        script wrote, ``_RECORDED_IN_SCRIPT``, it recorded itself)."""
        items = [item for item in items if item.outcome not in _RECORDED_IN_SCRIPT]
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
                    item.outcome,
                    {"stopActivity": self.stop, "items": len(item.activity or [])},
                )
                for item in items
                if item.outcome in self.recorded
            ],
        )


def _run(run: _Run, ids: list[str], batch_size: int, progress: Progress | None) -> BulkResult:
    """Write the batches in order. What follows a batch's write (its census, stops and
    records: ``_Run.finish``) runs on a thread while the next batch is written, one batch
    behind at most, so Redis writes the next batch as this process reads and sends; a batch's
    stops still go out after its own write, and all of them before this returns."""
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    if progress is not None:
        progress(0, len(ids))
    results: list[BulkItem] = []
    with ThreadPoolExecutor(1, thread_name_prefix="bulk-finish") as after:
        behind: Future[None] | None = None
        for part in batches:
            try:
                items, finish = run.batch(part)
            except BaseException:
                _wait_logged(behind)
                raise
            if behind is not None:
                behind.result()  # raises what the previous batch's finish raised
            # In the caller's context: its audit entries are the caller's (the request's
            # actor), as the batch's own script records them.
            behind = after.submit(contextvars.copy_context().run, finish)
            results.extend(items)
            if progress is not None:
                progress(len(results), len(ids))
        if behind is not None:
            behind.result()
    result = BulkResult(results, run.dry, run.stop, len(batches), run.report)
    log.info(
        "%s%s: %s",
        run.action,
        " (dry run)" if run.dry else "",
        ", ".join(f"{k} {v}" for k, v in result.totals.items() if v),
    )
    return result


def _wait_logged(behind: Future[None] | None) -> None:
    """Wait for the previous batch's finish while a write failed, logging its own failure
    (the write's is the one raised)."""
    if behind is not None and (exc := behind.exception()) is not None:
        log.warning("the stops and records of a batch failed: %s", exc, exc_info=exc)


def check_id_count(count: int) -> None:
    """Raises ``TooManySessions`` when a request names more than ``MAX_IDS`` session ids."""
    if count > MAX_IDS:
        raise TooManySessions(
            f"At most {MAX_IDS} sessionIds per request (got {count}); split the list, or "
            "select with a filter.",
            {"param": "sessionIds", "max": MAX_IDS, "got": count},
        )


def bulk_archive(
    store: Store,
    dispatcher: Dispatcher,
    *,
    session_ids: list[str] | None = None,
    flt: BulkFilter | None = None,
    stop_activity: bool = False,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    max_selected: int | None = None,
    progress: Progress | None = None,
) -> BulkResult:
    """Archive the sessions named by ``session_ids`` (duplicates once) or selected by ``flt``
    (exactly one of the two), ancestors first (so a subtree is archived in its root's
    transition whatever the order of the ids), in batches of ``batch_size``. Results come in
    the order the ids were named (a filter's: ancestors first, then oldest activity first).

    Raises ``InvalidParams`` (both or neither given, a bad id list or filter),
    ``TooManySessions`` (more than ``MAX_IDS`` ids, or a filter selecting more than
    ``max_selected``/``FLEET_BULK_FILTER_MAX``; nothing is written), ``StoreUnavailable``
    (batches before the failing one stay archived, as single archives would).
    """
    if (session_ids is None) == (flt is None):
        raise InvalidParams(
            "Give exactly one of sessionIds or filter.", {"param": "sessionIds|filter"}
        )
    if not 1 <= batch_size <= 5_000:
        raise InvalidParams("batch size must be between 1 and 5000.", {"param": "batchSize"})
    if session_ids is not None:
        if not isinstance(session_ids, list) or not all(isinstance(s, str) for s in session_ids):
            raise InvalidParams("sessionIds must be a list of strings.", {"param": "sessionIds"})
        check_id_count(len(session_ids))
        named = list(dict.fromkeys(session_ids))
        ids = write_order(store, named)  # answered in the order they were named
        idle_before = None
    else:
        assert flt is not None
        ids = select(store, flt, limit=max_selected)
        idle_before = None if flt.idle_since is None else parse_instant(flt.idle_since, "idleSince")
    run = _Run(
        store,
        dispatcher,
        stop=stop_activity,
        dry=dry_run,
        describe_refused=True,
        action="bulk_archive",
        idle_before=idle_before,
    )
    result = _run(run, ids, batch_size, progress)
    if session_ids is not None:
        place = {sid: i for i, sid in enumerate(named)}
        result.results.sort(key=lambda item: place[item.session_id])
    return result


def auto_archive(
    store: Store,
    dispatcher: Dispatcher,
    *,
    idle_seconds: float | None = None,
    dry_run: bool = False,
    cwd: str | None = None,
    now: int | None = None,
    limit: int | None = None,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> BulkResult:
    """One run of the auto-archive policy: archive the sessions ``auto_candidates`` finds
    (idle longer than ``idle_seconds``; ``None`` or 0: the policy is off) that have
    no live work; busy ones come back ``refused`` and are left alone (nothing is stopped).
    ``cwd`` narrows the run to one directory. Raises ``InvalidParams`` when the policy is off
    (0 seconds); ``StoreUnavailable``."""
    age = idle_seconds
    if not age or age <= 0:
        raise InvalidParams(
            "Auto-archive is off: give an idle age in seconds (--idle-seconds).",
            {"param": "idleSeconds"},
        )
    ids, cutoff = auto_candidates(store, idle_seconds=age, now=now, cwd=cwd, limit=limit)
    run = _Run(
        store,
        dispatcher,
        stop=False,
        dry=dry_run,
        describe_refused=dry_run,
        action="auto_archive",
        recorded=("archived",),
        idle_before=cutoff,
        with_unarchive=True,
    )
    return _run(run, ids, batch_size, progress)
