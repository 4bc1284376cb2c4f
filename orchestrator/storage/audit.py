"""The audit trail: an append-only record of every lifecycle change, in Redis (a fleet-wide
stream and a list per session).

Each change (archive, unarchive, set_title, delete, close, and the bulk forms of these) is one
entry ``{at, action, outcome, actor, sessionId, detail}`` appended to the fleet-wide stream
(``Keys.audit_all``, capped at ``Store.audit_max_global``) and to the session's trail
(``Keys.audit_log``, a list capped at ``Store.audit_max_per_session``), the same entry id in
both (the stream's); the oldest entries are trimmed. Refusals are recorded too (outcome
``refused``). A bulk archive leaves each session's entry in its batch's hash
(``Keys.audit_batch``, named by the session hash) until the session's next entry moves it to
the list, so a bulk over many sessions adds no key per session to Redis's key table; ``read``
merges it.

An archive or unarchive reaches the descendants its transition archived or restored, a delete
the descendants it deleted: each gets the session's entry in its own trail (same id, action,
outcome, actor and time; detail ``{"ancestorId": <session>}``), while the fleet-wide stream
keeps one entry per request. A trail never holds one id twice (one entry per transition per
session), so its entries page by id like any other.

Who asked is the *actor*: the interface that received the request sets it (``rest:<client
host>``, ``acp:stdio``, ``acp:ws:<client host>``, ``cli``, ``worker``) with ``acting_as``
(per request, a context variable) or ``set_default_actor`` (per process); ``unknown`` when
nobody did.

Recording is best effort: a failure is logged and never fails the change it records (the
change is already made by then, and the stores it lives in are the source of truth). Archives,
unarchives and deletes are the exception: ``archive.lua`` (single and bulk archives),
``unarchive.lua`` and ``delete_session.lua`` append their entries (same fields, same exact
trimming; ``script_recorder``) in the script that makes the change, so it is never committed
unaudited (nor, for an archive, uncounted).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from orchestrator import entries
from orchestrator.errors import InvalidParams
from orchestrator.storage import scripts
from orchestrator.storage.store import Store, retried

log = logging.getLogger(__name__)

#: Longest page ``read`` returns.
MAX_READ = 1000
#: A stream entry id (``<ms>-<seq>``), as ``before`` takes it.
_ENTRY_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")

_actor: ContextVar[str | None] = ContextVar("fleet_audit_actor", default=None)
_default_actor = "unknown"


def set_default_actor(name: str) -> None:
    """Set the actor of this process (``cli``, ``worker``, ``acp:stdio``): used wherever no
    request set one. A worker thread starts with an empty context, so a per-process default
    is what reaches it."""
    global _default_actor
    _default_actor = name


@contextmanager
def acting_as(name: str) -> Iterator[None]:
    """Record changes made inside the block (and in tasks or threads it starts through
    ``asyncio``) as made by ``name``, e.g. ``rest:10.0.0.7``."""
    token = _actor.set(name)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> str:
    """Who is acting now: the request's actor, else the process's, else ``unknown``."""
    return _actor.get() or _default_actor


def record(
    store: Store,
    session_id: str,
    action: str,
    outcome: str,
    *,
    actor: str | None = None,
    **detail: Any,
) -> str | None:
    """Append one entry for ``session_id`` to its trail and to the fleet-wide stream.

    ``action`` names the change (``archive``, ``unarchive``, ``set_title``, ``delete``,
    ``close``, ``bulk_archive`` ...); ``outcome`` a short word (``archived``, ``refused``,
    ...); ``actor`` defaults to ``current_actor()``; ``detail`` is stored as JSON (values must
    be JSON-serializable). Returns the entry id, or ``None`` when it could not be written
    (logged as a warning; never raises for a store failure).
    """
    ids = record_many(store, [(session_id, action, outcome, detail)], actor=actor)
    return ids[0] if ids else None


def detail_json(detail: dict[str, Any]) -> str:
    """An entry's ``detail`` field as stored (compact JSON, sorted keys); scripts that write
    entries themselves (``archive.lua``) are given it (``entries.detail_json``)."""
    return entries.detail_json(detail)


def script_recorder(
    store: Store,
    action: str,
    detail: dict[str, Any],
    *,
    actor: str | None = None,
    **extra: Any,
) -> str:
    """The JSON a Lua script that audits its own change is given (``record_in_script`` in
    ``_lib.lua``): ``{auditAll, auditSession (per-session key prefix), maxSession, maxGlobal,
    action, actor (``current_actor()`` unless given), detail (stored form), **extra}``. The
    entry then commits with the change, with the fields and trimming of ``record``."""
    k = store.keys
    return json.dumps(
        {
            "auditAll": k.audit_all,
            "auditSession": k.audit_log(""),
            "maxSession": store.audit_max_per_session,
            "maxGlobal": store.audit_max_global,
            "action": action,
            "actor": actor or current_actor(),
            "detail": detail_json(detail),
            **extra,
        }
    )


def record_many(
    store: Store,
    entries: list[tuple[str, str, str, dict[str, Any]]],
    *,
    actor: str | None = None,
) -> list[str]:
    """Append ``(session_id, action, outcome, detail)`` entries in one round trip (bulk
    operations). Returns the per-session entry ids, or ``[]`` when the write failed (logged as
    a warning; never raises for a store failure)."""
    if not entries:
        return []
    try:
        pipe = store.redis.pipeline(transaction=False)
        record_into(pipe, store, entries, actor=actor)
        ids = store.execute(pipe, raise_on_error=True)[-1]
    except Exception as exc:  # best effort: the change itself is already made
        _not_recorded(entries, exc)
        return []
    return [str(entry_id) for entry_id in ids]


def record_into(
    pipe: Any,
    store: Store,
    entries: list[tuple[str, str, str, dict[str, Any]]],
    *,
    actor: str | None = None,
) -> None:
    """Queue ``record_many``'s entries on a redis-py ``pipe`` the caller sends with
    ``Store.execute`` (one script, ``audit_record.lua``, whose reply is the entry ids), so they
    share a round trip with other best-effort writes. Their time is the server's clock when
    the script runs."""
    # Exact trimming (no "~"): the cap is a promise to the operator.
    scripts.queue_audit_record(
        store,
        pipe,
        recorder=script_recorder(store, "", {}, actor=actor),
        entries=[(sid, action, outcome, detail_json(d)) for sid, action, outcome, d in entries],
    )


def _not_recorded(entries: list[tuple[str, str, str, dict[str, Any]]], exc: Exception) -> None:
    first = entries[0]
    log.warning(
        "audit entries (%d, first %s/%s) not recorded: %s: %s",
        len(entries),
        first[1],
        first[2],
        type(exc).__name__,
        exc,
        extra={"session_id": first[0]},
    )


def _decode(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    try:
        detail = json.loads(fields.get("detail") or "{}")
    except ValueError:
        detail = {"raw": fields.get("detail")}
    return {
        "id": entry_id,
        "at": fields.get("at", ""),
        "action": fields.get("action", ""),
        "outcome": fields.get("outcome", ""),
        "actor": fields.get("actor", ""),
        "sessionId": fields.get("sessionId", ""),
        "detail": detail,
    }


@retried
def read(
    store: Store, session_id: str | None = None, count: int = 50, before: str | None = None
) -> list[dict[str, Any]]:
    """Audit entries newest first: the session's (or, with ``session_id=None``, the whole
    fleet's), at most ``count`` (1..``MAX_READ``), only those older than the entry id
    ``before`` when given (to page on from the last entry of a page).

    Each entry is ``{"id", "at", "action", "outcome", "actor", "sessionId", "detail"}``; in a
    session's trail ``sessionId`` is that session, also for an entry an ancestor's archive,
    unarchive or delete left there (``detail`` ``{"ancestorId"}``; ``id`` the ancestor's
    entry).
    Raises ``InvalidParams`` for a bad ``count`` or ``before``; ``StoreUnavailable``.
    """
    if not 1 <= count <= MAX_READ:
        raise InvalidParams(f"limit must be between 1 and {MAX_READ}.", {"param": "limit"})
    if before is not None and (
        not _ENTRY_ID.fullmatch(before) or max(int(part) for part in before.split("-")) > 2**64 - 1
    ):
        raise InvalidParams(
            "before must be the id of an audit entry (as returned).", {"param": "before"}
        )
    limit = None if before is None else _id_key(before)
    if limit == (0, 0):
        return []  # nothing comes before the first possible id (in any spelling: "0-00")
    top = "+" if limit is None else "({}-{}".format(*limit)
    if session_id is None:
        rows = store.redis.xrevrange(store.keys.audit_all, max=top, min="-", count=count)
        return [_decode(entry_id, fields) for entry_id, fields in rows]
    # The session's trail (a list, capped, so read whole) with the entries waiting in bulk
    # batches (the newest: the next entry moves them to the list first), in one script.
    listed = scripts.audit_trail(store, session_id=session_id)
    # The list and the waiting entries together keep the cap the list alone keeps.
    trail = listed[-store.audit_max_per_session :]
    entries = [_decode(fields.pop("id"), {**fields, "sessionId": session_id}) for fields in trail]
    entries = [e for e in entries if limit is None or _id_key(e["id"]) < limit]
    entries.sort(key=lambda e: _id_key(e["id"]), reverse=True)
    return entries[:count]


def _id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as numbers, in the stream's order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
