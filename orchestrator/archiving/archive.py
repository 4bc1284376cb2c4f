"""Archive and unarchive: the archive never hides running work.

One transition archives one session or many: ``ArchiveRun`` drives ``archiving/archive.lua``
over a batch of sessions; ``archive`` runs it for a batch of one, ``bulk.bulk_archive`` and
``bulk.auto_archive`` for many (``docs/decisions/one-archive-transition.md``).

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
  event (``orchestrator/storage/events.py``), the session first, its descendants after; an archive's
  events go out before its stop requests (``historyLength``: the session's history length
  once the archive had stopped its turns).
- Each descendant a transition archives or restores gets the session's audit entry in its own
  trail too (same id, action, outcome, actor and time; detail ``{"ancestorId"}``), written by
  the transition's script; the fleet-wide trail keeps one entry per request.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from orchestrator.archiving import scripts
from orchestrator.archiving.archive_run import MAX_CONFIRMED as MAX_CONFIRMED
from orchestrator.archiving.archive_run import REFUSAL_RECHECKS as REFUSAL_RECHECKS
from orchestrator.archiving.archive_run import ArchiveResult as ArchiveResult
from orchestrator.archiving.archive_run import ArchiveRun as ArchiveRun
from orchestrator.archiving.archive_run import Confirmed as Confirmed
from orchestrator.archiving.archive_run import Defer as Defer
from orchestrator.errors import (
    ActivityChanged,
    AncestorArchived,
    InvalidParams,
    SessionActive,
    SessionNotFound,
)
from orchestrator.families import Dispatcher
from orchestrator.session.sessions import check_session_id
from orchestrator.storage import audit, events
from orchestrator.storage.store import Store
from orchestrator.turn.turns import CANCELLED_BY_ARCHIVE

log = logging.getLogger(__name__)


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
    """Archive a session (and its subtree): an ``ArchiveRun`` of one. ``confirmed``: with
    ``stop_activity``, the (family, id) pairs the user confirmed stopping (a refusal's
    ``activity``); anything live beyond them refuses the archive with ``ActivityChanged`` and
    writes nothing. ``cause``: what the turns it stops record as ``cancelledBy``
    (``turns.CANCELLED_BY_DELETE`` for a delete's archive). ``defer``: given the stop
    fan-out's bookkeeping (its counts and ``stop`` audit entry, as a function queuing them on
    a pipeline), writes it off the caller's path (``Bookkeeper.submit``, as the HTTP API
    passes); it is written inline, one round trip, when ``None``.

    Every outcome, a refusal included, is counted (``fleet_archives``) and recorded in the
    audit trail; an archive's entry and count are written by its script, so they commit with
    it, and what its stop fan-out sent follows as a ``stop`` entry. Raises
    ``SessionNotFound`` (unknown, malformed or deleted id), ``SessionActive`` (live work and no
    ``stop_activity``), ``ActivityChanged`` (live work beyond ``confirmed``), ``InvalidParams``
    (``confirmed`` without ``stop_activity``, or too long), ``StoreUnavailable`` (nothing
    written).
    """
    sid = check_session_id(session_id)
    run = ArchiveRun(
        store,
        dispatcher,
        stop=stop_activity,
        dry=False,
        describe_refused=True,
        action="archive",
        binding=_binding(stop_activity, confirmed),
        cause=cause,
        single=True,
        defer=defer,
    )
    [item], finish = run.batch([sid])
    finish()
    if item.outcome == "not_found":
        raise SessionNotFound(sid)
    if item.outcome == "refused":
        found = item.activity or []
        if sid in run.changed:
            raise ActivityChanged(sid, found)
        raise SessionActive(sid, found)
    count, txn = run.answers[sid]
    done = ArchiveResult(
        sid,
        item.outcome,
        archived_count=count,
        stopped=run.stopped.get(sid, []),
        stop_report=run.report,
        txn=txn,
    )
    if item.outcome == "archived":
        log.info(
            "archived (%d in subtree, stopActivity=%s)",
            count,
            stop_activity,
            extra={"session_id": sid},
        )
    return done


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
    # No times given: the script reads the server's clock itself, no TIME round trip.
    result = scripts.unarchive(store, session_id=sid, recorder=recorder)
    if isinstance(result, scripts.UnarchiveNotFound):
        raise SessionNotFound(sid)
    if isinstance(result, scripts.UnderArchivedAncestor):
        raise AncestorArchived(sid, result.ancestor_id)
    if isinstance(result, scripts.NotArchived):
        return 0
    log.info("unarchived (%s in subtree)", result.count, extra={"session_id": sid})
    events.publish_many(store, [("unarchived", s, {"archived": False}) for s in result.restored])
    return result.count


def unarchive_to_wire(session_id: str, restored: int) -> dict[str, Any]:
    """JSON shape of an unarchive, used by the REST API and the CLI: ``{"sessionId",
    "archived": false, "restored"}`` (``restored``: what ``unarchive`` returned)."""
    return {"sessionId": session_id, "archived": False, "restored": restored}
