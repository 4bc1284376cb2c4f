"""The archiving package's door to Redis: one typed function per Lua script beside it
(``archive.lua``, ``unarchive.lua``, ``bulk_depths.lua``, ``reconcile_mark.lua``).

Only this module builds those scripts' ARGV and reads their replies. ``archive``,
``unarchive`` and ``reconcile_mark`` raise ``StoreUnavailable`` when Redis cannot be reached;
``bulk_depths`` raises redis-py's own errors (its caller retries them: it only reads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator.storage.store import Store


class ArchiveOutcome(StrEnum):
    """What ``archive`` did with one session, named as the audit trail and the API name it."""

    ARCHIVED = "archived"
    ALREADY_ARCHIVED = "already_archived"
    NOT_FOUND = "not_found"
    #: Its idle clock is no longer older than ``idle_before_ms``: nothing written.
    SKIPPED = "skipped"
    #: Live work and no ``stop_activity``: nothing written.
    ACTIVE = "active"
    #: Live work beyond what was ``confirmed``: nothing written.
    CHANGED = "changed"


#: ``archive.lua``'s one-letter codes (lower case).
_CODES = {
    "a": ArchiveOutcome.ARCHIVED,
    "l": ArchiveOutcome.ALREADY_ARCHIVED,
    "n": ArchiveOutcome.NOT_FOUND,
    "s": ArchiveOutcome.SKIPPED,
    "x": ArchiveOutcome.ACTIVE,
    "c": ArchiveOutcome.CHANGED,
}


@dataclass(frozen=True)
class ArchiveCode:
    """One session's answer: its ``outcome`` and whether its subtree has ``live`` work (known
    for ``active``, for ``archived``, and with ``stop_activity`` for ``already_archived``)."""

    outcome: ArchiveOutcome
    live: bool


@dataclass(frozen=True)
class Described:
    """What ``archive`` says of one session beyond its code: ``would`` (dry run only: the ids
    its transition would have archived), ``turns`` (the turns it stopped, a flat list tid,
    sid, fromState, toState, label, settlement JSON or ``''``: ``turns.stopped_by_archive``),
    ``census`` (with ``stop_activity``, the subtree's census read with the write: the flat
    list ``activity.census_of_rows`` reads), ``count`` (the sessions its transition archived,
    0 unless archived) and ``txn`` (the transition it is archived by)."""

    would: list[str]
    turns: list[str]
    census: list[Any]
    count: int
    txn: str


@dataclass(frozen=True)
class ArchiveReply:
    """``archive``'s answer: one ``ArchiveCode`` per session in the order asked, and the
    sessions it ``described`` by their index (0-based) in that order: those with any of
    would, turns or census, and the session of a batch of one."""

    codes: list[ArchiveCode]
    described: dict[int, Described]


def archive(
    store: Store,
    *,
    session_ids: list[str],
    stop_activity: bool,
    dry_run: bool,
    txn_base: str,
    idle_before_ms: int | None,
    with_unarchive: bool,
    record: str,
    confirmed: str,
) -> ArchiveReply:
    """The archive transition of ``session_ids`` in order, in one atomic step, durably unless
    ``dry_run``; the server's clock gives its times. ``txn_base`` names the transitions
    (``<txn_base>.<position>``); ``idle_before_ms`` (epoch ms) skips sessions active since
    (their clock: ``max(updatedMs, unarchivedMs)`` with ``with_unarchive``); ``record`` is
    the JSON of what the script records (``audit.script_recorder``); ``confirmed`` is ``''``
    or a JSON array of ``family:id`` strings. Raises ``WriteUnconfirmed`` as
    ``Store.run(durable=True)`` does."""
    argv: list[Any] = [
        "1" if stop_activity else "0",
        "1" if dry_run else "0",
        "",  # the script reads the server's clock: its times are its commit's, no TIME trip
        txn_base,
        "" if idle_before_ms is None else idle_before_ms,
        "1" if with_unarchive else "0",
        record,
        confirmed,
        *session_ids,
    ]
    codes, extras = store.run("archive", argv, durable=not dry_run)
    flat = list(extras)
    described = {
        int(flat[pos]) - 1: Described(
            [str(s) for s in flat[pos + 1]],
            list(flat[pos + 2]),
            list(flat[pos + 3]),
            int(flat[pos + 4]),
            str(flat[pos + 5]),
        )
        for pos in range(0, len(flat), 6)
    }
    return ArchiveReply(
        [ArchiveCode(_CODES[code.lower()], code.isupper()) for code in str(codes)], described
    )


@dataclass(frozen=True)
class Unarchived:
    """``unarchive``: ``count`` sessions were unarchived, ``restored`` their ids (the session
    first)."""

    count: int
    restored: list[str]


@dataclass(frozen=True)
class NotArchived:
    """``unarchive``: the session was not archived; nothing written (the no-op is audited)."""


@dataclass(frozen=True)
class UnderArchivedAncestor:
    """``unarchive``: refused, the session lies under the archived ``ancestor_id`` (the
    farthest one); nothing restored (the refusal is audited)."""

    ancestor_id: str


@dataclass(frozen=True)
class UnarchiveNotFound:
    """``unarchive``: no such session."""


def unarchive(
    store: Store,
    *,
    session_id: str,
    recorder: str,
    now_ms: int | None = None,
    now_iso: str = "",
) -> Unarchived | NotArchived | UnderArchivedAncestor | UnarchiveNotFound:
    """Unarchive ``session_id`` and exactly the descendants its archive transition archived,
    durably, stamping each with ``unarchivedMs`` (``now_ms``, epoch ms) and ``unarchivedAt``
    (``now_iso``, ISO 8601): both given, or neither (the server's clock). Every outcome but
    not found is audited by ``recorder`` (the JSON ``audit.script_recorder`` makes). Raises
    ``StoreUnavailable`` also when only one of the two times is given."""
    args: list[Any] = [session_id, "" if now_ms is None else now_ms, now_iso, recorder]
    reply = store.run("unarchive", args, durable=True)
    outcome = str(reply[0])
    if outcome == "not_found":
        return UnarchiveNotFound()
    if outcome == "ancestor":
        return UnderArchivedAncestor(str(reply[1]))
    if outcome == "not_archived":
        return NotArchived()
    return Unarchived(int(reply[1]), [str(s) for s in reply[2]])


def bulk_depths(store: Store, *, session_ids: list[str]) -> dict[str, int]:
    """The lineage depth of each of ``session_ids`` that is not a root (roots are left out),
    in one call."""
    flat = store.script("bulk_depths")(keys=[], args=[store.keys.prefix, *session_ids])
    return {session_ids[int(pos) - 1]: int(n) for pos, n in zip(flat[::2], flat[1::2], strict=True)}


class MarkOutcome(StrEnum):
    """What ``reconcile_mark`` did."""

    #: One more stop attempt was counted.
    ATTEMPT = "attempt"
    #: The attempt reached the limit: the archive hazard was written.
    HAZARD = "hazard"
    #: Attempts (and a hazard, if any) were removed.
    CLEARED = "cleared"
    #: ``clear`` found nothing to remove.
    NONE = "none"
    #: The session is no longer archived by that transition: left alone.
    STALE = "stale"


@dataclass(frozen=True)
class Marked:
    """``reconcile_mark``'s answer: its ``outcome``, the ``attempts`` counted so far (for
    ``attempt`` and ``hazard``, else 0) and, for ``cleared``, whether a hazard was removed."""

    outcome: MarkOutcome
    attempts: int = 0
    had_hazard: bool = False


class MarkOp(StrEnum):
    """What ``reconcile_mark`` is asked to do."""

    #: Count one more stop re-dispatch (and write the hazard on reaching the limit).
    ATTEMPT = "attempt"
    #: The census found the session quiet: remove its attempts and hazard.
    CLEAR = "clear"


def reconcile_mark(
    store: Store,
    *,
    session_id: str,
    txn: str,
    op: MarkOp,
    next_ms: int = 0,
    max_attempts: int = 0,
    since_iso: str = "",
    families: list[str] | None = None,
) -> Marked:
    """The reconciler's bookkeeping on archived ``session_id``, for its archive transition
    ``txn`` only (otherwise ``stale``, nothing written). ``attempt``: one more stop
    re-dispatch is counted, retried by the next run from ``next_ms`` (epoch ms, 0: at once);
    reaching ``max_attempts`` writes the archive hazard once (since ``since_iso``, ISO 8601,
    naming ``families``). ``clear``: attempts and hazard are removed."""
    args: list[Any] = [
        session_id,
        txn,
        str(op),
        next_ms,
        max_attempts,
        since_iso,
        json.dumps(families or []),
    ]
    reply = store.run("reconcile_mark", args)
    outcome = MarkOutcome(str(reply[0]))
    if outcome in (MarkOutcome.ATTEMPT, MarkOutcome.HAZARD):
        return Marked(outcome, int(reply[1]))
    return Marked(outcome, had_hazard=outcome is MarkOutcome.CLEARED and str(reply[1]) == "1")
