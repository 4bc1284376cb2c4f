"""The session package's door to Redis: one typed function per Lua script beside it
(``create_session.lua``, ``set_title.lua``, ``gate_admit.lua``, ``gate_many.lua``,
``delete_session.lua``, ``index_page.lua``).

Only this module builds those scripts' ARGV and reads their replies. Every function raises
``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.session.fencing import StepGuard
from orchestrator.storage.idempotency import Idempotency
from orchestrator.storage.store import Store


class Verdict(StrEnum):
    """The gate's answer on one session (``gate_refusal`` in ``storage/_lib.lua``)."""

    OK = "ok"
    ARCHIVED = "archived"
    DELETED = "deleted"
    MISSING = "missing"


class TitleOutcome(StrEnum):
    """What ``set_title`` did."""

    SET = "ok"
    NOT_FOUND = "not_found"
    #: A generated title met a title a client set: the client's stays.
    DISCARDED = "discarded"


@dataclass(frozen=True)
class GuardLost:
    """A launch script (``job_create``, ``reminder_create``) stored nothing: the asking step's
    turn no longer runs or that copy of the step no longer owns it."""


@dataclass(frozen=True)
class AtLimit:
    """A launch script stored nothing: the session already has ``live`` live items of its
    kind (its ``FLEET_MAX_*`` limit)."""

    live: int


def launch_refusal(reply: object) -> GuardLost | AtLimit | None:
    """A launch script's refusal (``stopped`` or ``limit:<live>``), or ``None`` when it
    stored what it was asked to."""
    if reply == "stopped":
        return GuardLost()
    if isinstance(reply, str) and reply.startswith("limit:"):
        return AtLimit(int(reply.removeprefix("limit:")))
    return None


@dataclass(frozen=True)
class Created:
    """``create_session``: the session was created (``archived``: born archived under an
    archived ancestor)."""

    archived: bool


@dataclass(frozen=True)
class Replayed:
    """``create_session``: the idempotency key was seen before; ``session_id`` is the session
    its first request created. Nothing was created."""

    session_id: str


@dataclass(frozen=True)
class Refused:
    """``create_session``: nothing created. ``reason`` is ``key_reused`` (the key came with
    another request), ``stopped`` (the guarding step no longer holds its step),
    ``parent_not_found``, ``exists``, or ``limit`` with ``limit`` (``depth`` or
    ``children``) and the ``count`` that reached it."""

    reason: str
    limit: str = ""
    count: int = 0


def create_session(
    store: Store,
    *,
    session_id: str,
    cwd: str,
    cwd_hash: str,
    parent_id: str | None,
    now_ms: int,
    now_iso: str,
    guard: StepGuard | None,
    max_depth: int,
    max_children: int,
    model: str | None,
    idempotency: Idempotency | None,
    agent: str = "",
) -> Created | Replayed | Refused:
    """Create a session (a subagent when ``parent_id`` is given), durably (fsynced before the
    reply). Raises ``WriteUnconfirmed`` as ``Store.run(durable=True)`` does."""
    reply = store.run(
        "create_session",
        [
            session_id,
            cwd,
            cwd_hash,
            parent_id or "",
            now_ms,
            now_iso,
            *StepGuard.argv(guard),
            max_depth,
            max_children,
            model or "",
            *Idempotency.argv(idempotency),
            agent,
        ],
        durable=True,
    )
    kind = str(reply[0])
    if kind == "created":
        return Created(archived=str(reply[1]) == "1")
    if kind == "replay":
        return Replayed(str(reply[1]))
    if kind == "limit":
        return Refused("limit", str(reply[1]), int(reply[2]))
    return Refused(kind)


def set_title(store: Store, *, session_id: str, title: str, source: str) -> TitleOutcome:
    """Store ``title`` set by ``source`` (``client`` or ``generated``); a client's title is
    written durably."""
    reply = store.run("set_title", [session_id, title, source], durable=source == "client")
    return TitleOutcome(str(reply))


def gate_admit(store: Store, *, session_id: str) -> Verdict:
    """The gate's verdict on one session (one round trip)."""
    return Verdict(str(store.run("gate_admit", [session_id])))


def gate_many(store: Store, *, session_ids: list[str]) -> list[Verdict]:
    """The gate's verdicts on ``session_ids``, in order, in one round trip."""
    if not session_ids:
        return []
    return [Verdict(str(v)) for v in store.run("gate_many", session_ids)]


class DeleteOutcome(StrEnum):
    """What ``delete_session`` did."""

    DELETED = "deleted"
    MISSING = "missing"
    #: With ``check_live``: the session or a descendant has live work; nothing written.
    ACTIVE = "active"
    #: With ``archive_txn``: the session is no longer archived by that transition.
    UNARCHIVED = "unarchived"


def delete_session(
    store: Store, *, session_id: str, check_live: bool, recorder: str, archive_txn: str
) -> tuple[DeleteOutcome, list[str]]:
    """Delete the session and every descendant not yet deleted, durably, audited (by
    ``recorder``, the JSON ``audit.script_recorder`` makes) at the server's time. Returns the
    outcome and, when ``deleted``, the descendants it deleted (breadth first)."""
    args = [session_id, "", "1" if check_live else "0", recorder, archive_txn]
    reply = store.run("delete_session", args, durable=True)
    outcome = DeleteOutcome(str(reply[0]))
    below = [str(sid) for sid in reply[1]] if outcome is DeleteOutcome.DELETED else []
    return outcome, below


@dataclass(frozen=True)
class IndexEntry:
    """One entry of the index of sessions that are not archived: the session, its score (last
    activity, epoch ms, as the index stores it) and its lineage depth (0: a root)."""

    session_id: str
    score: str
    depth: int


def index_page(
    store: Store, *, cwd_hash: str, after_score: str, after_member: str, count: int
) -> list[IndexEntry]:
    """The next ``count`` entries of the index of sessions that are not archived (of one cwd
    when ``cwd_hash`` is not ``''``), in the index's order, after the entry (``after_score``,
    ``after_member``) (``''`` and ``''`` for the first page), found where that entry is or
    would be now, so entries removed or moved meanwhile shift no other past the reader."""
    flat, deep = store.run("index_page", [cwd_hash, after_score, after_member, count])
    depth = {int(pos) - 1: int(n) for pos, n in zip(deep[0::2], deep[1::2], strict=True)}
    return [
        IndexEntry(str(member), str(score), depth.get(i, 0))
        for i, (member, score) in enumerate(zip(flat[0::2], flat[1::2], strict=True))
    ]
