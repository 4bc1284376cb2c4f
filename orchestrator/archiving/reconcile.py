"""The archive reconciler: the archive flag is the desired state, the census the actual one.

An archive with ``stopActivity`` writes the flag, then fans stops out once and never waits.
Work can outlive that fan-out: a crash between the write and the fan-out, a stop message
lost or rejected by the broker, a handler that failed, a worker that is down. ``reconcile``
finds archived sessions whose census is still not empty ``grace_seconds`` after their
``archivedAt`` and re-dispatches stops for exactly the live families (``dispatch_stops``).

Per archive transition it counts its re-dispatches on the session hash (``reconcileTxn``,
``reconcileAttempts``, ``reconcileNextMs``). After ``max_attempts`` the session gets an
*archive hazard* (``archiveHazard``: JSON ``{since, attempts, families}``, shown as
``_meta.agentFleet.archiveHazard``), counted in ``fleet_archive_hazards_total`` and audited
(action ``reconcile``, outcome ``hazard``); from then on it is retried only every
``backoff_seconds``. When its census is empty it is recorded quiet (``mark_quiet``) and its
attempts and hazard are cleared (audited as ``cleared`` when there was a hazard).

Which sessions are examined: the archived index is scanned in batches (``ZSCAN``), and per
batch one pipelined ``HMGET`` reads the bookkeeping fields; only sessions that are the root of
their archive transition (a subtree archived with its ancestor is covered by the ancestor's
census), past the grace period and not yet recorded quiet for this transition (or with attempts
pending) get a census (``census_many``, a few round trips per batch).
Skipping quiet sessions is sound because the gate refuses every step of an archived lineage
and job and reminder starts check it too, so nothing new can start under a quiet archive;
``include_quiet=True`` re-examines them anyway (an operator's full sweep: a stray wake-up that
slipped past a bug would show there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.archiving import scripts
from orchestrator.archiving.stops import dispatch_stops
from orchestrator.census.activity import ActivityItem, census_many, mark_quiet
from orchestrator.families import Dispatcher
from orchestrator.storage import audit, metrics
from orchestrator.storage.store import Store, iso, retried

log = logging.getLogger(__name__)

#: Sessions read per batch of the archived index.
BATCH = 500
#: Intervals between two retries of an archive flagged with a hazard.
HAZARD_BACKOFF_INTERVALS = 10
#: The interval those retries count in when no periodic pass runs (an interval of 0).
_UNSCHEDULED_INTERVAL_SECONDS = 10.0
#: Stop re-dispatches for one archive before it is flagged with an archive hazard (and
#: retried only every ``backoff_seconds``).
MAX_ATTEMPTS = 5
#: Most per-session entries a report lists (its counts cover every session).
_LISTED = 100
_FIELDS = (
    "archived",
    "deleted",
    "archiveTxn",
    "archivedAt",
    "quietTxn",
    "reconcileTxn",
    "reconcileAttempts",
    "reconcileNextMs",
    "archiveHazard",
    "parentId",
)


@dataclass
class Report:
    """What one run did (or, with ``dry_run``, would do). Counts are sessions:
    ``scanned`` read from the archived index, ``examined`` given a census, ``in_grace``
    skipped as too recently archived, ``deferred`` still live but not stopped again while
    backing off, ``quiet`` found
    without live work, ``restopped`` given stop re-dispatches, ``hazards`` newly flagged,
    ``cleared`` whose attempts or hazard were cleared. ``sent``/``failed`` count stop messages
    by family; ``sessions`` lists up to 100 acted-on sessions."""

    dry_run: bool = False
    scanned: int = 0
    examined: int = 0
    in_grace: int = 0
    deferred: int = 0
    quiet: int = 0
    restopped: int = 0
    hazards: int = 0
    cleared: int = 0
    sent: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    sessions: list[dict[str, Any]] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """JSON shape of the CLI's ``--json`` and the task's result."""
        return {
            "dryRun": self.dry_run,
            "scanned": self.scanned,
            "examined": self.examined,
            "inGrace": self.in_grace,
            "deferred": self.deferred,
            "quiet": self.quiet,
            "restopped": self.restopped,
            "hazards": self.hazards,
            "cleared": self.cleared,
            "sent": dict(self.sent),
            "failed": dict(self.failed),
            "sessions": list(self.sessions),
        }

    def _note(self, entry: dict[str, Any]) -> None:
        if len(self.sessions) < _LISTED:
            self.sessions.append(entry)


def _epoch_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


@retried
def _read_rows(store: Store, sids: list[str]) -> list[list[str | None]]:
    pipe = store.redis.pipeline(transaction=False)
    for sid in sids:
        pipe.hmget(store.keys.session(sid), *_FIELDS)
    rows: list[list[str | None]] = pipe.execute()
    return rows


@retried
def _parent_txns(store: Store, parents: list[str]) -> list[str | None]:
    pipe = store.redis.pipeline(transaction=False)
    for pid in parents:
        pipe.hget(store.keys.session(pid), "archiveTxn")
    txns: list[str | None] = pipe.execute()
    return txns


@retried
def _scan(store: Store, cursor: int, count: int) -> tuple[int, list[tuple[str, float]]]:
    """One ``ZSCAN`` page of the archived index (every member present for the whole scan is
    returned at least once; one added meanwhile is caught by the next run)."""
    next_cursor, page = store.redis.zscan(store.keys.index("archived"), cursor, count=count)
    return int(next_cursor), list(page)


def _candidates(
    store: Store,
    sids: list[str],
    *,
    now: int,
    grace_ms: int,
    include_quiet: bool,
    report: Report,
) -> dict[str, dict[str, Any]]:
    """The sessions of a batch that need a census, with their bookkeeping fields."""
    picked: dict[str, dict[str, Any]] = {}
    for sid, row in zip(sids, _read_rows(store, sids), strict=True):
        h: dict[str, Any] = dict(zip(_FIELDS, row, strict=True))
        txn = h["archiveTxn"]
        if h["archived"] != "1" or h["deleted"] == "1" or not txn:
            continue
        pending = h["reconcileTxn"] == txn and bool(h["reconcileAttempts"])
        if h["quietTxn"] == txn and not pending and not include_quiet:
            continue
        archived_ms = _epoch_ms(h["archivedAt"])
        if archived_ms is not None and now - archived_ms < grace_ms:
            report.in_grace += 1
            continue
        # Backing off suppresses the re-dispatch only: the census still runs, so a hazard is
        # cleared as soon as the work is gone (hazards are rare, so this stays cheap).
        h["backoff"] = pending and int(h["reconcileNextMs"] or 0) > now
        picked[sid] = h
    with_parent = [sid for sid, h in picked.items() if h["parentId"]]
    if with_parent:
        txns = _parent_txns(store, [picked[sid]["parentId"] for sid in with_parent])
        for sid, parent_txn in zip(with_parent, txns, strict=True):
            if parent_txn == picked[sid]["archiveTxn"]:
                del picked[sid]  # archived with its ancestor: the ancestor's census covers it
    return picked


def _families(items: list[ActivityItem]) -> list[str]:
    return sorted({item.family for item in items})


def _settle_quiet(store: Store, sid: str, h: dict[str, Any], report: Report) -> None:
    report.quiet += 1
    mark_quiet(store, sid)
    if h["reconcileTxn"] is None and not h["archiveHazard"]:
        return
    marked = scripts.reconcile_mark(
        store, session_id=sid, txn=h["archiveTxn"], op=scripts.MarkOp.CLEAR
    )
    if marked.outcome is not scripts.MarkOutcome.CLEARED:
        return
    report.cleared += 1
    report._note({"sessionId": sid, "outcome": "cleared"})
    if marked.had_hazard:
        audit.record(store, sid, "reconcile", "cleared")
        log.info("archive hazard cleared: the session is quiet", extra={"session_id": sid})


def _restop(
    store: Store,
    dispatcher: Dispatcher,
    sid: str,
    h: dict[str, Any],
    items: list[ActivityItem],
    *,
    now: int,
    backoff_ms: int,
    max_attempts: int,
    report: Report,
) -> None:
    families = _families(items)
    stops = dispatch_stops(dispatcher, sid, items, store=store)
    for family, count in stops.sent.items():
        report.sent[family] = report.sent.get(family, 0) + count
    for family, _ in stops.failed:
        report.failed[family] = report.failed.get(family, 0) + 1
    report.restopped += 1
    attempts = int(h["reconcileAttempts"] or 0) + 1 if h["reconcileTxn"] == h["archiveTxn"] else 1
    # Below the limit the next run retries; from the limit on, only after the backoff.
    next_ms = now + backoff_ms if attempts >= max_attempts else 0
    marked = scripts.reconcile_mark(
        store,
        session_id=sid,
        txn=h["archiveTxn"],
        op=scripts.MarkOp.ATTEMPT,
        next_ms=next_ms,
        max_attempts=max_attempts,
        since_iso=iso(now),
        families=families,
    )
    entry: dict[str, Any] = {"sessionId": sid, "outcome": "restopped", "families": families}
    if marked.outcome is scripts.MarkOutcome.STALE:
        report._note(entry)
        return
    entry["attempts"] = marked.attempts
    log.warning(
        "archived session still has live work (%s): stops sent again (attempt %s)",
        ", ".join(families),
        marked.attempts,
        extra={"session_id": sid},
    )
    if marked.outcome is scripts.MarkOutcome.HAZARD:
        report.hazards += 1
        entry["outcome"] = "hazard"
        metrics.incr_many(store, [(metrics.ARCHIVE_HAZARDS, (f,), 1) for f in families])
        audit.record(store, sid, "reconcile", "hazard", attempts=marked.attempts, families=families)
        log.error(
            "archive hazard: live work (%s) survived %s stop attempts",
            ", ".join(families),
            marked.attempts,
            extra={"session_id": sid},
        )
    report._note(entry)


def hazard_backoff_seconds(interval_seconds: float) -> float:
    """Seconds between two retries of a hazard for a reconciler passing every
    ``interval_seconds`` (0: no periodic pass; the retries then count 10 s intervals)."""
    return HAZARD_BACKOFF_INTERVALS * (interval_seconds or _UNSCHEDULED_INTERVAL_SECONDS)


def reconcile(
    store: Store,
    dispatcher: Dispatcher,
    *,
    grace_seconds: float = 5.0,
    max_attempts: int = MAX_ATTEMPTS,
    backoff_seconds: float = 100.0,
    dry_run: bool = False,
    include_quiet: bool = False,
    batch: int = BATCH,
) -> Report:
    """One pass over the archived sessions (see the module docstring): stop again what
    outlived its archive, flag hazards, record quiet ones and clear their bookkeeping.

    ``grace_seconds`` after ``archivedAt`` before a session is looked at; ``max_attempts``
    re-dispatches before a hazard; ``backoff_seconds`` between retries from then on (the
    scheduled task passes 10x its interval). With ``dry_run`` nothing is written or sent
    (records whose owner vanished are not settled either) and the report says what would
    be done. Raises ``StoreUnavailable`` when the index or the sessions cannot be read; a
    failed stop dispatch is reported, never raised.
    """
    report = Report(dry_run=dry_run)
    grace_ms = int(grace_seconds * 1000)
    backoff_ms = int(backoff_seconds * 1000)

    # ZSCAN may return a member twice (when the set is rehashed mid-scan): a session stopped
    # again in this run is not stopped (and counted) twice. Only acted-on ids are kept.
    acted: set[str] = set()

    def run_batch(sids: list[str]) -> None:
        sids = [sid for sid in sids if sid not in acted]
        now = store.now_ms()
        picked = _candidates(
            store, sids, now=now, grace_ms=grace_ms, include_quiet=include_quiet, report=report
        )
        if not picked:
            return
        report.examined += len(picked)
        found = census_many(store, list(picked), dispatcher, settle=not dry_run, archived_only=True)
        for sid, h in picked.items():
            items = found[sid]
            if dry_run:
                if items:
                    report.restopped += 1
                    report._note(
                        {"sessionId": sid, "outcome": "would_restop", "families": _families(items)}
                    )
                else:
                    report.quiet += 1
                continue
            if items and h["backoff"]:
                report.deferred += 1
            elif items:
                acted.add(sid)
                _restop(
                    store,
                    dispatcher,
                    sid,
                    h,
                    items,
                    now=now,
                    backoff_ms=backoff_ms,
                    max_attempts=max_attempts,
                    report=report,
                )
            else:
                _settle_quiet(store, sid, h, report)

    cursor = 0
    while True:
        cursor, page = _scan(store, cursor, batch)
        sids = [sid for sid, _ in page]
        report.scanned += len(sids)
        for start in range(0, len(sids), batch):
            run_batch(sids[start : start + batch])
        if cursor == 0:
            return report
