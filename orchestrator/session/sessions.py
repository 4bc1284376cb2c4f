"""Sessions: create, read, delete (listing: ``orchestrator/session/listing.py``; the record and the
checks of client input: ``orchestrator/session/session_record.py``, both re-exported here). Archive
state lives in ``orchestrator/archiving/archive.py``.

A session is stored as one Redis hash (``Keys.session``) plus its listing indexes; see
``orchestrator/storage/keys.py`` for the schema. Wire shapes follow ACP ``SessionInfo`` (acp.md).
"""

from __future__ import annotations

from typing import Any

from orchestrator import untrusted
from orchestrator.errors import (
    IdempotencyKeyReused,
    InvalidParams,
    SessionArchived,
    SessionNotFound,
    TurnStopped,
    quoted_id,
)
from orchestrator.models.model import check_model
from orchestrator.session import limits, scripts
from orchestrator.session.fencing import StepGuard
from orchestrator.session.listing import (
    DEFAULT_PAGE,
    MAX_PAGE,
    MAX_QUERY,
    SEARCH_BATCH,
    SEARCH_SCAN,
    ArchivedFilter,
    Page,
    list_sessions,
    normalize_query,
    title_matches,
)
from orchestrator.session.session_record import (
    MAX_CWD_LENGTH,
    SESSION_ID_RE,
    Session,
    check_cwd,
    check_session_id,
    check_utf8,
    cwd_hash,
)
from orchestrator.storage import audit, events, idempotency
from orchestrator.storage.store import Store, iso, new_id, retried

__all__ = [
    "archived_refusal",
    "DEFAULT_PAGE",
    "MAX_CWD_LENGTH",
    "MAX_PAGE",
    "MAX_QUERY",
    "SEARCH_BATCH",
    "SEARCH_SCAN",
    "SESSION_ID_RE",
    "ArchivedFilter",
    "Page",
    "Session",
    "check_cwd",
    "check_session_id",
    "check_utf8",
    "conversation",
    "create_session",
    "cwd_hash",
    "delete_session",
    "descendants",
    "get_session",
    "list_sessions",
    "normalize_query",
    "quoted_id",
    "title_matches",
    "write_delete",
]


def create_session(
    store: Store,
    cwd: str,
    parent_id: str | None = None,
    *,
    guard: StepGuard | None = None,
    model: str | None = None,
    idempotency_key: str | None = None,
    agent: str = "",
) -> Session:
    """Create a session in ``cwd`` (absolute), optionally as a subagent of ``parent_id``,
    asking for ``model`` (a model name for the backend, ``FLEET_MODEL``; a subagent given none
    takes its parent's), run by ``agent`` (an external agent's name from ``FLEET_AGENTS_FILE``,
    ``orchestrator/agents``; ``None``: ``FLEET_AGENT``, empty for the built-in model).

    A child created under an archived lineage is born archived, in its ancestor's archive
    transition (so it is hidden and gated with it, and restored with it). With ``guard`` (the
    copy of the step that spawns the subagent) nothing is created once its turn no longer runs
    or that copy no longer owns the step (``orchestrator/session/fencing.py``).
    Raises ``InvalidParams`` (bad cwd), ``SessionNotFound`` (unknown or deleted parent),
    ``TurnStopped`` (the guarding turn stopped or its copy was superseded), ``LimitReached``
    (a subagent deeper than ``FLEET_MAX_SUBAGENT_DEPTH``, or beyond the parent's
    ``FLEET_MAX_SUBAGENTS_PER_SESSION`` live subagents; counted in the creating script),
    ``StoreUnavailable``.

    With ``idempotency_key`` (a client's, ``orchestrator/storage/idempotency.py``) the key is
    recorded with the session in the creating script: a retry with it returns the session
    the first created (whatever it is now; ``SessionNotFound`` once deleted) and creates
    nothing. Raises also ``InvalidIdempotencyKey``, ``IdempotencyKeyReused`` (the key came
    with another cwd, parent or model) and ``WriteOutcomeUnknown`` (the reply was lost: the
    session may have been created).
    """
    cwd = check_cwd(cwd)
    if parent_id is not None:
        check_session_id(parent_id)
    model = check_model(model)
    agent = agent or ""
    request = [cwd, parent_id or "", model, *([agent] if agent else [])]
    idem = idempotency.for_request(store, idempotency_key, *request)
    sid = new_id("sess")
    ms = store.now_ms()
    caps = [
        limits.SUBAGENT_DEPTH.maximum(store.settings),
        limits.SUBAGENTS_PER_SESSION.maximum(store.settings),
    ]
    outcome = (
        "session creation",
        "list the sessions in that cwd: a session it created is the newest",
    )
    with idempotency.outcome_unknown(*outcome, keyed=idem is not None):
        result = scripts.create_session(
            store,
            session_id=sid,
            cwd=cwd,
            cwd_hash=cwd_hash(cwd),
            parent_id=parent_id,
            now_ms=ms,
            now_iso=iso(ms),
            guard=guard,
            max_depth=caps[0],
            max_children=caps[1],
            model=model,
            idempotency=idem,
            agent=agent,
        )
    if isinstance(result, scripts.Replayed):
        with idempotency.written(*outcome, keyed=True):
            return get_session(store, result.session_id)
    if isinstance(result, scripts.Refused):
        _refuse_creation(result, parent_id, guard, caps)
    with idempotency.written(*outcome, keyed=idem is not None):
        return get_session(store, sid)


def _refuse_creation(
    refused: scripts.Refused, parent_id: str | None, guard: StepGuard | None, caps: list[int]
) -> None:
    """Raise the error for a creation the script refused; return for ``exists`` (an id made
    twice: the session is there)."""
    if refused.reason == "key_reused":
        raise IdempotencyKeyReused("session creation")
    if refused.reason == "stopped":
        raise TurnStopped(guard.turn_id if guard else "")
    if refused.reason == "parent_not_found":
        raise SessionNotFound(parent_id or "")
    if refused.reason == "limit":
        depth = refused.limit == "depth"
        limit = limits.SUBAGENT_DEPTH if depth else limits.SUBAGENTS_PER_SESSION
        raise limit.reached(caps[0] if depth else caps[1], refused.count)


@retried
def _read(store: Store, sid: str) -> dict[str, str]:
    found: dict[str, str] = store.redis.hgetall(store.keys.session(sid))
    return found


def get_session(store: Store, session_id: str, *, include_deleted: bool = False) -> Session:
    """Return the stored session. Raises ``SessionNotFound`` for an unknown, malformed or
    (unless ``include_deleted``) deleted id; ``StoreUnavailable``."""
    sid = check_session_id(session_id)
    h = _read(store, sid)
    if not h or (h.get("deleted") == "1" and not include_deleted):
        raise SessionNotFound(sid)
    return Session.from_hash(sid, h)


MAX_CONVERSATION = 1000


def conversation(store: Store, session_id: str, limit: int = 200) -> list[dict[str, Any]]:
    """The last ``limit`` (1..``MAX_CONVERSATION``) ``session/update`` payloads of a session's
    conversation, oldest first (what ACP ``session/load`` replays). Archived sessions keep
    theirs. Raises ``SessionNotFound``, ``InvalidParams`` (bad limit), ``StoreUnavailable``."""
    if not 1 <= limit <= MAX_CONVERSATION:
        raise InvalidParams(f"limit must be between 1 and {MAX_CONVERSATION}.", {"param": "limit"})
    get_session(store, session_id)
    raw: list[str] = _history_tail(store, session_id, limit)
    return untrusted.stored_updates(raw)


@retried
def _history_tail(store: Store, session_id: str, limit: int) -> list[str]:
    found: list[str] = store.redis.lrange(store.keys.history(session_id), -limit, -1)
    return found


def delete_session(store: Store, session_id: str) -> bool:
    """Delete a session and its subtree without looking at their work
    (``orchestrator.archiving.deletion.delete`` is the interfaces' delete, which refuses to hide
    live
    work): they leave every listing and their steps are refused. Idempotent (``False`` when
    there was nothing to delete). A deletion is recorded in the audit trail (and in each
    deleted descendant's). Raises ``StoreUnavailable``."""
    return write_delete(store, session_id, check_live=False)[0] == "deleted"


def write_delete(
    store: Store, session_id: str, *, check_live: bool, archive_txn: str = ""
) -> tuple[str, list[str]]:
    """The delete's one write (``delete_session.lua``): the session and every descendant not
    yet deleted, any depth, are deleted together and audited in the same script. Returns
    ``(outcome, descendants)``: ``deleted`` with the ids of the descendants it deleted
    (breadth first), ``missing`` (nothing to delete), with ``check_live`` ``active`` (the
    session or a descendant has live work), or with ``archive_txn`` ``unarchived`` (the
    session is no longer archived by that transition); nothing written and ``[]`` but for
    ``deleted``. A delete emits a ``deleted`` event for each session it deleted, in the same
    script. Raises ``StoreUnavailable``."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        return "missing", []
    recorder = audit.script_recorder(store, "delete", {}, eventsMax=events.STREAM_MAXLEN)
    # The script reads the server's clock, so its entry's time is its commit's.
    outcome, below = scripts.delete_session(
        store,
        session_id=session_id,
        check_live=check_live,
        recorder=recorder,
        archive_txn=archive_txn,
    )
    return outcome.value, below


def descendants(store: Store, session_id: str) -> list[str]:
    """Ids of every descendant of the session, any depth, breadth first. A delete takes the
    session's subtree and leaves its parent's children set, so none of these is deleted."""
    return descendants_many(store, [session_id])[session_id]


def descendants_many(store: Store, roots: list[str]) -> dict[str, list[str]]:
    """The one walk of subtrees in Python: every descendant of each root, any depth, breadth
    first, the children of one session in sorted order, deleted ones included (the order of
    ``descendants`` in ``_lib.lua``): one pipelined round trip per tree level for all roots
    together. Raises redis-py's errors as they come (callers retry or translate)."""
    out: dict[str, list[str]] = {root: [] for root in roots}
    level = [(root, root) for root in dict.fromkeys(roots)]
    while level:
        pipe = store.redis.pipeline(transaction=False)
        for _, sid in level:
            pipe.smembers(store.keys.children(sid))
        nxt: list[tuple[str, str]] = []
        for (root, _), members in zip(level, pipe.execute(), strict=True):
            for child in sorted(members):
                out[root].append(child)
                nxt.append((root, child))
        level = nxt
    return out


@retried
def archived_refusal(store: Store, session_id: str) -> SessionArchived:
    """The ``SessionArchived`` to raise for work refused on an archived session: it names the
    farthest archived ancestor when there is one, the session an unarchive must be asked of
    (the archived set is materialized down the lineage, so the session's own unarchive, and
    that of every ancestor below that one, would be refused with ``AncestorArchived``)."""
    lineage = store.redis.lrange(store.keys.lineage(session_id), 0, -1)
    if lineage:
        flags = store.redis.smismember(store.keys.archived, lineage)
        archived = [str(a) for a, flag in zip(lineage, flags, strict=True) if flag]
        if archived:
            return SessionArchived(session_id, archived[-1])
    return SessionArchived(session_id)
