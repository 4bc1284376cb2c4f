"""Delete never hides running work: the archive's rule (``orchestrator/archiving/archive.py``)
applied to
delete.

A delete takes the session's whole subtree with it: the subagents are its work, and a
descendant left behind would point at a parent that no longer exists. Every descendant is
deleted in the same script as the session (each leaves every listing and index, and gets the
delete's audit entry in its own trail, detail ``{"ancestorId"}``), and the session leaves its
parent's children set.

A deleted session leaves every listing and its activity can no longer be read, so work still
running under it could no longer be seen or stopped. Hence:

- Without ``stop_activity`` a session whose subtree has live work is refused with
  ``SessionActive`` carrying every live item (the shape of an archive refusal). The check and
  the write are one script (``delete_session.lua``), so no work can start unseen between them.
- With ``stop_activity`` it is first archived with stop (``archive.archive``: the flag is
  written, the lineage's turns stopped in that script, stops fanned out; ``confirmed`` binds
  it to what the user saw), then the census is polled until the subtree is quiet for at most
  ``STOP_WAIT_SECONDS``, then deleted by the same checked script. Work still live
  after the wait refuses the delete with ``SessionActive``: the session stays archived (not
  deleted), so the reconciler keeps stopping its work and a later delete can finish. The
  delete is bound to the archive transition it made (or found): a session unarchived while
  the delete waited is not deleted (``SessionUnarchived``; checked at each poll and again in
  the delete's script), since what was created after the unarchive is not what the delete
  was asked to remove.

Two deletes may race (the same session twice, or a session and an ancestor): the one whose
script runs first deletes, and the other finds the session gone at whatever step it has
reached (its archive, its wait, its refusal's census) and answers ``deleted=False``, with
what it had itself stopped. It never answers ``SessionNotFound``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NoReturn

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from orchestrator.agents.pool import remove_home
from orchestrator.archiving.archive import Confirmed, archive
from orchestrator.archiving.stops import StopReport
from orchestrator.census.activity import ActivityItem, census
from orchestrator.errors import (
    InvalidParams,
    SessionActive,
    SessionNotFound,
    SessionUnarchived,
)
from orchestrator.families import Dispatcher
from orchestrator.session.sessions import SESSION_ID_RE, quoted_id, write_delete
from orchestrator.storage import audit
from orchestrator.storage.store import Store, retried
from orchestrator.turn.turns import CANCELLED_BY_DELETE

log = logging.getLogger(__name__)

#: Seconds a delete with ``stop_activity`` waits for the stopped work to end before it deletes;
#: work still live then refuses the delete (``SessionActive``; the session stays archived).
STOP_WAIT_SECONDS = 20.0
#: Seconds between two census reads while a delete waits for its stopped work to end.
_POLL_SECONDS = 0.1
#: How often a refusal is re-checked when the census found nothing (the work ended between
#: the atomic check and the census read).
_REFUSAL_RECHECKS = 3


@dataclass
class DeleteResult:
    """Outcome of ``delete``: ``deleted`` is False when there was nothing to delete;
    ``deleted_descendants`` the ids of the descendants deleted with it (breadth first);
    ``stopped`` and ``stop_report`` are what its archive stopped (``stop_activity`` only)."""

    session_id: str
    deleted: bool
    stop_activity: bool = False
    deleted_descendants: list[str] = field(default_factory=list)
    stopped: list[ActivityItem] = field(default_factory=list)
    stop_report: StopReport = field(default_factory=StopReport)

    def to_wire(self) -> dict[str, Any]:
        """``{"sessionId", "deleted", "deletedDescendants": [ids]}`` (the REST answer), plus
        ``stopped`` and ``stopDispatch`` (as an archive answers them) when it was asked to
        stop activity. A malformed ``sessionId`` is quoted by its first 80 characters
        (``quoted_id``), as every answer quotes one."""
        out: dict[str, Any] = {
            "sessionId": quoted_id(self.session_id),
            "deleted": self.deleted,
            "deletedDescendants": list(self.deleted_descendants),
        }
        if self.stop_activity:
            out["stopped"] = [item.to_wire() for item in self.stopped]
            out["stopDispatch"] = {
                "sent": self.stop_report.sent,
                "failed": [{"family": f, "error": e} for f, e in self.stop_report.failed],
            }
        return out


def delete(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    *,
    stop_activity: bool = False,
    confirmed: Confirmed | None = None,
    wait_seconds: float | None = None,
) -> DeleteResult:
    """Delete a session and its subtree unless that would hide live work (see the module
    docstring). Idempotent: an unknown, malformed or deleted id answers ``deleted=False``.
    ``wait_seconds`` overrides ``STOP_WAIT_SECONDS``.

    Raises ``SessionActive`` (live work in the subtree: without ``stop_activity``, or still
    live after the wait), ``ActivityChanged`` (live work beyond ``confirmed``; nothing
    written), ``SessionUnarchived`` (``stop_activity``: unarchived while the delete waited;
    nothing deleted), ``InvalidParams`` (``confirmed`` without ``stop_activity``),
    ``StoreUnavailable``.
    """
    result = DeleteResult(session_id, False, stop_activity)
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        return result
    txn = ""
    if stop_activity:
        try:
            archived = archive(
                store,
                dispatcher,
                session_id,
                stop_activity=True,
                confirmed=confirmed,
                cause=CANCELLED_BY_DELETE,
            )
        except SessionNotFound:
            return result
        result.stopped, result.stop_report = archived.stopped, archived.stop_report
        txn = archived.txn
        wait = STOP_WAIT_SECONDS if wait_seconds is None else wait_seconds
        waited = _wait_quiet(store, dispatcher, session_id, wait, txn)
        if waited == "gone":
            return result  # deleted by another delete while this one waited
        if waited == "unarchived":
            _unarchived(store, session_id)
    elif confirmed is not None:
        raise InvalidParams(
            "confirmedActivity is only meaningful with stopActivity.",
            {"param": "confirmedActivity"},
        )
    for _ in range(_REFUSAL_RECHECKS):
        outcome, below = write_delete(store, session_id, check_live=True, archive_txn=txn)
        if outcome == "unarchived":
            _unarchived(store, session_id)
        if outcome != "active":
            result.deleted, result.deleted_descendants = outcome == "deleted", below
            if result.deleted:
                remove_home(store.settings.state_dir, session_id)
            return result
        items = _live(store, session_id, dispatcher)
        if items is None:
            return result  # deleted by another delete since this one's check
        if items:
            _refused(store, session_id, items, stop_activity)
    items = _live(store, session_id, dispatcher)
    if items is None:
        return result
    _refused(store, session_id, items, stop_activity)


def _live(store: Store, session_id: str, dispatcher: Dispatcher) -> list[ActivityItem] | None:
    """The subtree's census, or ``None`` once the session is gone (another delete)."""
    try:
        return census(store, session_id, dispatcher)
    except SessionNotFound:
        return None


def _wait_quiet(
    store: Store, dispatcher: Dispatcher, session_id: str, seconds: float, txn: str
) -> str:
    """Poll until the subtree has no live work or ``seconds`` have passed, checking first
    each time that the session is still archived by ``txn``. Returns ``quiet``, ``live``
    (the wait ran out), ``gone`` (deleted by another delete) or ``unarchived``."""

    def poll() -> str:
        if not _bound(store, session_id, txn):
            return "unarchived"
        items = _live(store, session_id, dispatcher)
        return "gone" if items is None else "live" if items else "quiet"

    retrying = Retrying(
        stop=stop_after_delay(seconds),
        wait=wait_fixed(_POLL_SECONDS),
        retry=retry_if_result(lambda outcome: outcome == "live"),
    )
    try:
        outcome: str = retrying(poll)
        return outcome
    except RetryError:
        log.warning(
            "delete: work still live %.1fs after its stop; not deleted",
            seconds,
            extra={"session_id": session_id},
        )
        return "live"


@retried
def _bound(store: Store, session_id: str, txn: str) -> bool:
    """Whether the session is still archived by ``txn`` (a deleted one counts as bound: the
    census that follows says it is gone)."""
    archived, current, deleted = store.redis.hmget(
        store.keys.session(session_id), "archived", "archiveTxn", "deleted"
    )
    return bool(deleted == "1" or (archived == "1" and current == txn))


def _unarchived(store: Store, session_id: str) -> NoReturn:
    audit.record(store, session_id, "delete", "refused", reason="unarchived")
    log.info("delete: unarchived while it waited; not deleted", extra={"session_id": session_id})
    raise SessionUnarchived(session_id)


def _refused(
    store: Store, session_id: str, items: list[ActivityItem], stop_activity: bool
) -> NoReturn:
    families = sorted({item.family for item in items})
    audit.record(
        store,
        session_id,
        "delete",
        "refused",
        stopActivity=stop_activity,
        families=families,
        items=len(items),
    )
    raise SessionActive(session_id, items, action="delete")
