"""The census package's door to Redis: one typed function per Lua script beside it
(``census.lua``, ``mark_quiet.lua``, ``note_quiet.lua``).

Only this module builds those scripts' ARGV and reads their replies. ``mark_quiet`` and
``note_quiet`` raise ``StoreUnavailable`` when Redis cannot be reached; ``census`` raises
redis-py's own errors (its callers retry them: it only reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.storage.store import Store


@dataclass(frozen=True)
class FamilyRows:
    """One family's part of a session's census: ``live`` rows (each an item id and the fields
    its family's item builder reads) and the ``vanished`` ids (items whose owner is gone)."""

    family: str
    live: list[list[Any]]
    vanished: list[str]


@dataclass(frozen=True)
class Quiet:
    """A session newly marked quiet: when its archive was written (``archived_at``, ISO 8601)
    and whether it is the ``root`` its archive was asked for."""

    session_id: str
    archived_at: str
    root: bool


def census(store: Store, *, session_ids: list[str], archived_only: bool) -> list[list[FamilyRows]]:
    """Each session's live rows per family, in the order of ``session_ids``, in one call (each
    family's liveness rule applied in Lua). With ``archived_only`` a session not archived when
    the script runs reads as having nothing."""
    if not session_ids:
        return []
    args = [store.keys.prefix, "1" if archived_only else "0", *session_ids]
    return [census_rows(one) for one in store.script("census")(keys=[], args=args)]


def census_rows(reply: list[Any]) -> list[FamilyRows]:
    """One session's ``census_rows`` (``storage/_lib.lua``) as the script replied it: per
    family, its name, its live rows and its vanished ids. Other scripts that read a census
    with their write (``archive.lua``) reply with the same shape."""
    return [FamilyRows(str(name), list(live), [str(v) for v in gone]) for name, live, gone in reply]


def mark_quiet(store: Store, *, session_id: str, now_iso: str) -> Quiet | None:
    """Mark an archived session quiet for its current archive transition (with its subtree
    archived in the same transition); ``None`` when nothing was newly marked."""
    marked = store.run("mark_quiet", [session_id, now_iso])
    if not marked:
        return None
    return Quiet(session_id, str(marked[0]), str(marked[1]) == "1")


def note_quiet(store: Store, *, session_id: str) -> tuple[str, list[Quiet]]:
    """After work of ``session_id`` ended: mark quiet, where due, the session and then each
    archived ancestor nearest first. Returns the server's time (ISO 8601) and the sessions
    newly marked."""
    flat = [str(v) for v in store.run("note_quiet", [session_id])]
    marked = [Quiet(flat[i], flat[i + 1], flat[i + 2] == "1") for i in range(1, len(flat), 3)]
    return flat[0], marked
