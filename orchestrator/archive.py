"""Archive and unarchive: the archive never hides running work.

- Without ``stop_activity`` a session with live work is refused with ``SessionActive``
  carrying every live item. The check and the write are one Lua script, so no work can start
  unseen between them.
- With ``stop_activity`` the archive is written durably first (the gate reads it) and stops
  the lineage's turns in the same script (queued and between-steps turns end ``cancelled``,
  a step in flight is marked ``cancelling``: nothing it does lands after the archive), then
  stop requests fan out to the families without waiting; a failed dispatch is logged and
  never undoes the archive.
- With ``stop_activity`` and ``confirmed`` (the (family, id) pairs of the list the user saw
  and confirmed), the archive is bound to that list: when something live now was not
  confirmed (a turn that started since), it is refused with ``ActivityChanged`` carrying the
  current items, and nothing is written or stopped. The check is in the archive's own
  script. Without ``confirmed`` everything live is stopped (scripts, ACP session/archive).
- Archiving a session archives its whole subagent subtree in one transition. Unarchive
  restores exactly what that transition archived; a descendant archived on its own earlier
  stays archived. Unarchiving a session whose ancestor is still archived is refused with
  ``AncestorArchived`` (its steps would stay gated, so it would look active while it could not
  run). Neither changes ``updatedAt``; unarchive restarts, replays and re-arms nothing.
- Every session a transition archives or restores gets its own ``archived``/``unarchived``
  event (``orchestrator/events.py``), the session first, its descendants after; an archive's
  events go out before its stop requests (``historyLength``: the session's history length
  once the archive had stopped its turns).
- Each descendant a transition archives or restores gets the session's audit entry in its own
  trail too (same id, action, outcome, actor and time; detail ``{"ancestorId"}``), written by
  the transition's script; the fleet-wide trail keeps one entry per request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import audit, bookkeeping, events, metrics
from orchestrator.activity import (
    ActivityItem,
    census,
    census_of_rows,
    mark_quiet,
    merge_items,
)
from orchestrator.errors import (
    ActivityChanged,
    AncestorArchived,
    InvalidParams,
    SessionActive,
    SessionNotFound,
)
from orchestrator.families import Dispatcher
from orchestrator.sessions import check_session_id
from orchestrator.stops import StopReport, dispatch_stops
from orchestrator.store import Store, new_id
from orchestrator.turns import CANCELLED_BY_ARCHIVE, stopped_by_archive

log = logging.getLogger(__name__)

#: How often a refusal is re-checked when the census found nothing (the work ended between
#: the atomic check and the census read).
_REFUSAL_RECHECKS = 3
#: The most items a confirmation may name (a census is far smaller; this bounds the input).
MAX_CONFIRMED = 10_000

#: What a confirmation names: (family, id) pairs as ``ActivityItem`` gives them.
Confirmed = list[tuple[str, str]]
#: Runs a piece of best-effort bookkeeping later, off the caller's path: given a function
#: that queues its writes on a redis-py pipeline (``bookkeeping.Bookkeeper.submit``).
Defer = Callable[[bookkeeping.Fill], object]


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


def archive(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    *,
    stop_activity: bool = False,
    confirmed: Confirmed | None = None,
    defer: Defer | None = None,
    cause: str = CANCELLED_BY_ARCHIVE,
) -> ArchiveResult:
    """Archive a session (and its subtree). ``confirmed``: with ``stop_activity``, the
    (family, id) pairs the user confirmed stopping (a refusal's ``activity``); ``cause``: what
    the turns it stops record as ``cancelledBy`` (``turns.CANCELLED_BY_DELETE`` for a delete's
    archive); anything live
    beyond them refuses the archive with ``ActivityChanged`` and writes nothing. ``defer``:
    given the stop fan-out's bookkeeping (its counts and ``stop`` audit entry, as a function
    queuing them on a pipeline), writes it off the caller's path (``Bookkeeper.submit``, as
    the HTTP API passes); it is written inline, one round trip, when ``None``.

    Every outcome, a refusal included, is counted (``fleet_archives``) and recorded in the
    audit trail; an archive's entry and count are written by its script, so they commit with
    it, and what its stop fan-out sent follows as a ``stop`` entry. Raises
    ``SessionNotFound`` (unknown, malformed or deleted id), ``SessionActive`` (live work and no
    ``stop_activity``), ``ActivityChanged`` (live work beyond ``confirmed``), ``InvalidParams``
    (``confirmed`` without ``stop_activity``, or too long), ``StoreUnavailable`` (nothing
    written).
    """
    sid = check_session_id(session_id)
    binding = _binding(stop_activity, confirmed)
    try:
        result = _archive(store, dispatcher, sid, stop_activity, binding, defer, cause)
    except SessionActive as refused:
        families = sorted({item.family for item in refused.items})
        metrics.incr_many(
            store,
            [(metrics.ARCHIVES, ("refused",), 1)]
            + [(metrics.ARCHIVE_REFUSALS, (family,), 1) for family in families],
        )
        audit.record(
            store,
            sid,
            "archive",
            "changed" if isinstance(refused, ActivityChanged) else "refused",
            stopActivity=stop_activity,
            families=families,
            items=len(refused.items),
        )
        raise
    return result


def check_confirmed_count(count: int) -> None:
    """Raises ``InvalidParams`` when a confirmation names more than ``MAX_CONFIRMED`` items."""
    if count > MAX_CONFIRMED:
        raise InvalidParams(
            f"confirmedActivity names more than {MAX_CONFIRMED} items (got {count}).",
            {"param": "confirmedActivity", "max": MAX_CONFIRMED},
        )


def _binding(stop_activity: bool, confirmed: Confirmed | None) -> str:
    """``confirmed`` as the archive script reads it: '' (not bound) or a JSON array of
    'family:id' strings."""
    if confirmed is None:
        return ""
    if not stop_activity:
        raise InvalidParams(
            "confirmedActivity is only meaningful with stopActivity.",
            {"param": "confirmedActivity"},
        )
    check_confirmed_count(len(confirmed))
    return json.dumps(sorted({f"{family}:{item_id}" for family, item_id in confirmed}))


def _archive(
    store: Store,
    dispatcher: Dispatcher,
    sid: str,
    stop_activity: bool,
    binding: str = "",
    defer: Defer | None = None,
    cause: str = CANCELLED_BY_ARCHIVE,
) -> ArchiveResult:
    txn = new_id("arc")
    recorder = audit.script_recorder(
        store,
        "archive",
        {},
        metric=store.keys.metric(metrics.ARCHIVES.name),
        eventsMax=events.STREAM_MAXLEN,
        cancelledBy=cause,
    )
    for _ in range(_REFUSAL_RECHECKS):
        # The script reads the server's clock itself ('' for nowIso): no TIME round trip.
        result = store.run(
            "archive",
            [sid, "1" if stop_activity else "0", "", txn, recorder, binding],
            durable=True,
        )
        outcome = result[0]
        if outcome == "not_found":
            raise SessionNotFound(sid)
        if outcome == "already":
            already = ArchiveResult(sid, "already_archived", txn=str(result[1]))
            if stop_activity:
                # Nothing changes in the archive state, but work that outlived an earlier
                # stop (a lost or failed dispatch) is asked to stop again: the census the
                # script read with the archive it found, so no stop names work created after
                # an unarchive that came since (a late stop touches nothing created since).
                already.stopped = census_of_rows(store, sid, list(result[2]), dispatcher)
                if not already.stopped:
                    mark_quiet(store, sid)
                already.stop_report = _fan_out(store, dispatcher, sid, already.stopped, defer=defer)
            return already
        if outcome == "archived":
            break
        items = census(store, sid, dispatcher)
        if outcome == "changed":
            if _unconfirmed(items, binding):
                raise ActivityChanged(sid, items)
        elif items:
            raise SessionActive(sid, items)
        # The work ended between the check and the census: try the archive again.
    else:
        items = census(store, sid, dispatcher)
        raise ActivityChanged(sid, items) if binding else SessionActive(sid, items)

    done = ArchiveResult(sid, "archived", archived_count=int(result[1]), txn=txn)
    log.info(
        "archived (%d in subtree, stopActivity=%s)",
        done.archived_count,
        stop_activity,
        extra={"session_id": sid},
    )
    # Every session the transition archived was told by the script, before its work is
    # stopped (as ACP's session/close would): its clients get the updates up to historyLength,
    # archived: true, then close it; the script also emitted the events of the turns it stopped.
    if stop_activity:
        # The census the script read right after its write, in the same atomic step: anything
        # that started before the write is in it, and anything that starts after it is refused
        # by the gate. An empty census records the session quiet right away. The turns the
        # script stopped lead the list (a turn.stop for them is a harmless poke).
        flipped = stopped_by_archive(store, sid, list(result[2]), publish=False)
        after = census_of_rows(store, sid, list(result[4]), dispatcher)
        if not after:
            mark_quiet(store, sid)
        done.stopped = merge_items(flipped, after)
        done.stop_report = _fan_out(store, dispatcher, sid, done.stopped, defer=defer)
    else:
        # The script found no live work when it wrote, so the subtree is quiet already; it is
        # marked so (not observed: there was nothing to stop and no time to measure).
        mark_quiet(store, sid, observe=False)
    return done


def _fan_out(
    store: Store,
    dispatcher: Dispatcher,
    sid: str,
    items: list[ActivityItem],
    *,
    defer: Defer | None = None,
) -> StopReport:
    """Send the stops of ``items`` (``dispatch_stops``), then count them and record what was
    sent as a ``stop`` audit entry beside the archive's, both in one pipelined round trip
    (best effort, like the fan-out: a failure is logged; ``bookkeeping.write``), through
    ``defer`` when given. The entry's time is when it is written (the server's clock), so it
    sorts by time as by id with the entries around it."""
    report = dispatch_stops(dispatcher, sid, items)
    entry: tuple[str, str, str, dict[str, Any]] | None = None
    if items or report.failed:
        failures = [family for family, _ in report.failed]
        detail = {
            "stopped": len(items),
            "families": sorted({item.family for item in items}),
            "stopFailures": failures,
        }
        entry = (sid, "stop", "partial" if failures else "sent", detail)
    actor = audit.current_actor()

    def fill(pipe: Any) -> None:
        metrics.incr_into(pipe, store, report.counts)
        if entry is not None:
            audit.record_into(pipe, store, [entry], actor=actor)

    if defer is None:
        bookkeeping.write(store, [fill])
    else:
        defer(fill)
    return report


def _unconfirmed(items: list[ActivityItem], binding: str) -> bool:
    """Whether the census names an item the binding does not (as the script decided)."""
    confirmed = set(json.loads(binding)) if binding else set()
    return any(f"{item.family}:{item.id}" not in confirmed for item in items)


def unarchive(store: Store, session_id: str) -> int:
    """Unarchive a session and the descendants its archive transition archived. Idempotent;
    returns how many sessions were restored (0 when it was not archived). Every outcome, a
    refusal and a no-op included, is recorded in the audit trail by the unarchive's script, so
    each entry commits with what the script found (``unarchived`` ``{restoredCount}``,
    ``not_archived`` ``{}``, ``refused`` ``{archivedAncestor}``), and each restored descendant
    gets the entry in its own trail too (``{ancestorId}``).

    Raises ``SessionNotFound``, ``AncestorArchived``, ``StoreUnavailable``.
    """
    sid = check_session_id(session_id)
    recorder = audit.script_recorder(store, "unarchive", {})
    # The script reads the server's clock itself ('' for both): no TIME round trip.
    result = store.run("unarchive", [sid, "", "", recorder], durable=True)
    outcome = result[0]
    if outcome == "not_found":
        raise SessionNotFound(sid)
    if outcome == "ancestor":
        raise AncestorArchived(sid, result[1])
    if outcome == "not_archived":
        return 0
    log.info("unarchived (%s in subtree)", result[1], extra={"session_id": sid})
    events.publish_many(store, [("unarchived", str(s), {"archived": False}) for s in result[2]])
    return int(result[1])


def unarchive_to_wire(session_id: str, restored: int) -> dict[str, Any]:
    """JSON shape of an unarchive, used by the REST API and the CLI: ``{"sessionId",
    "archived": false, "restored"}`` (``restored``: what ``unarchive`` returned)."""
    return {"sessionId": session_id, "archived": False, "restored": restored}
