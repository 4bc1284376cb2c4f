"""Bulk selection: which sessions a bulk archive's filter, or the auto-archive policy, picks.

A filter (cwd, last activity older than ``idleSince``, a title search) scans the listing
index of sessions that are not archived, oldest activity first, in chunks of ``_SCAN_CHUNK``
index entries, and returns at most ``FLEET_BULK_FILTER_MAX`` ids, ancestors first (by
lineage depth), so a selected subtree is archived in its root's transition.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from orchestrator.archiving import scripts as archiving_scripts
from orchestrator.errors import InvalidParams, TooManySessions
from orchestrator.session import scripts as session_scripts
from orchestrator.session.sessions import (
    SESSION_ID_RE,
    check_cwd,
    cwd_hash,
    normalize_query,
    title_matches,
)
from orchestrator.storage.store import Store, retried

#: Index entries read per round trip while a filter selects.
_SCAN_CHUNK = 1_000


@dataclass(frozen=True)
class BulkFilter:
    """What a filter selects among sessions that are not archived: ``cwd`` (an absolute path,
    compared in normal form: ``session_record.check_cwd``), ``idle_since`` (ISO 8601 with an
    offset or ``Z``: last activity strictly older), ``q`` (case-insensitive substring of the
    title). At least one is required."""

    cwd: str | None = None
    idle_since: str | None = None
    q: str | None = None


def parse_instant(value: object, param: str) -> int:
    """Epoch milliseconds of an ISO 8601 date-time that carries a UTC offset (``Z`` or
    ``+02:00``). Raises ``InvalidParams`` naming ``param`` otherwise (a date alone, a time
    without an offset, anything not a string or ``datetime``)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidParams(
                f"{param} must be an ISO 8601 date-time such as 2026-01-31T12:00:00Z "
                f"(got {value[:60]!r}).",
                {"param": param},
            ) from None
    else:
        raise InvalidParams(f"{param} must be an ISO 8601 date-time string.", {"param": param})
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidParams(
            f"{param} must carry a UTC offset or Z (got {str(value)[:60]!r}).", {"param": param}
        )
    return int(moment.timestamp() * 1000)


#: Where a scan stands: the (score, member) of the last index entry it read, or ``None``.
_Cursor = tuple[str, str] | None
#: A session a scan found: its id, the hash fields asked for, its lineage depth (0: a root).
_Found = tuple[str, list[str | None], int]


@retried
def _chunk(
    store: Store, where: str, below: float, cursor: _Cursor, fields: tuple[str, ...]
) -> tuple[list[_Found], _Cursor, bool]:
    """The index entries after ``cursor`` (``session/index_page.lua``: found by position,
    so sessions archived or active meanwhile shift nothing past the scan, with their lineage
    depths) with score below ``below``, the new cursor, and whether the index may hold
    more."""
    last_score, last = cursor or ("", "")
    page = session_scripts.index_page(
        store, cwd_hash=where, after_score=last_score, after_member=last, count=_SCAN_CHUNK
    )
    taken = sum(1 for entry in page if float(entry.score) < below)  # ascending: a prefix
    ids = [entry.session_id for entry in page[:taken]]
    more = len(page) == _SCAN_CHUNK and taken == len(page)
    after = (page[-1].score, page[-1].session_id) if page else cursor
    values: list[list[str | None]] = [[] for _ in ids]
    if ids and fields:
        pipe = store.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.hmget(store.keys.session(sid), *fields)
        values = pipe.execute()
    return (
        [(entry.session_id, v, entry.depth) for entry, v in zip(page[:taken], values, strict=True)],
        after,
        more,
    )


def _scan(store: Store, cwd: str | None, below: float, fields: tuple[str, ...]) -> Iterator[_Found]:
    """Sessions not archived (in ``cwd`` when given) with score (last activity, epoch ms)
    below ``below`` (``inf`` for all), oldest first, each once, with the hash ``fields`` and
    its lineage depth."""
    where = "" if cwd is None else cwd_hash(cwd)
    cursor: _Cursor = None
    seen: set[str] = set()
    while True:
        rows, cursor, more = _chunk(store, where, below, cursor, fields)
        for row in rows:
            if row[0] not in seen:  # moved past the scan by new activity: read again
                seen.add(row[0])
                yield row
        if not more:
            return


@retried
def _depths(store: Store, ids: list[str]) -> dict[str, int]:
    """The lineage depth of each of ``ids`` that is not a root (``bulk_depths.lua``: one
    script call for the chunk)."""
    return archiving_scripts.bulk_depths(store, session_ids=ids)


def roots_first(store: Store, ids: list[str]) -> list[str]:
    """``ids`` ordered by lineage depth (a stable sort: ties keep their order), so an
    ancestor comes before its descendants and archives them in its own transition."""
    depth: dict[str, int] = {}
    for start in range(0, len(ids), _SCAN_CHUNK):
        depth.update(_depths(store, ids[start : start + _SCAN_CHUNK]))
    return _by_depth([(sid, depth.get(sid, 0)) for sid in ids])


def write_order(store: Store, session_ids: list[str]) -> list[str]:
    """``session_ids`` (duplicates once, the first kept) in the order a bulk archive writes
    them: ancestors first, as a filter's selection is, so a named subtree is archived in its
    root's transition (and restored with it) whatever order the ids came in; malformed ids
    (answered ``not_found`` without a read) last. Raises ``StoreUnavailable``."""
    named = list(dict.fromkeys(session_ids))
    ids = roots_first(store, [sid for sid in named if SESSION_ID_RE.fullmatch(sid)])
    return ids + [sid for sid in named if not SESSION_ID_RE.fullmatch(sid)]


def _by_depth(found: list[tuple[str, int]]) -> list[str]:
    """The ids of ``found`` (id, lineage depth) in ``roots_first``'s order."""
    return [sid for sid, _ in sorted(found, key=lambda row: row[1])]


def _too_many(limit: int) -> TooManySessions:
    return TooManySessions(
        f"The filter selects more than {limit} sessions, the most one bulk archive may "
        "select (FLEET_BULK_FILTER_MAX); nothing was archived. Narrow the filter (cwd, "
        "idleSince, q), or archive in steps (an older idleSince first).",
        {"param": "filter", "max": limit, "setting": "FLEET_BULK_FILTER_MAX"},
    )


@contextmanager
def _in_filter() -> Iterator[None]:
    """A criterion's ``InvalidParams`` named by its place in the request, ``filter.cwd``,
    ``filter.q``, ``filter.idleSince`` (``data.param``), as a request's own validation names
    it (``body.filter.cwd``); its message keeps the criterion's name, which the CLI turns
    into its option (``--cwd``)."""
    try:
        yield
    except InvalidParams as exc:
        param = exc.data.get("param")
        if isinstance(param, str) and not param.startswith("filter"):
            exc.data["param"] = f"filter.{param}"
        raise


def select(store: Store, flt: BulkFilter, *, limit: int | None = None) -> list[str]:
    """Ids of the sessions (not archived, not deleted) ``flt`` selects, ancestors first.

    Raises ``InvalidParams`` for an empty filter or a bad criterion; ``TooManySessions``
    when more than ``limit`` (default ``FLEET_BULK_FILTER_MAX``) match; ``StoreUnavailable``.
    """
    if flt.cwd is None and flt.idle_since is None and flt.q is None:
        raise InvalidParams(
            "filter needs at least one of cwd, idleSince, q (an empty filter would select "
            "every session).",
            {"param": "filter"},
        )
    cap = store.settings.bulk_filter_max if limit is None else limit
    with _in_filter():
        cwd = None if flt.cwd is None else check_cwd(flt.cwd)
        needle = normalize_query(flt.q)
        if flt.q is not None and needle is None:
            raise InvalidParams("q must not be blank.", {"param": "q"})
        below = math.inf if flt.idle_since is None else parse_instant(flt.idle_since, "idleSince")
    found: list[tuple[str, int]] = []
    fields = ("title",) if needle is not None else ()
    for sid, values, depth in _scan(store, cwd, below, fields):
        if needle is not None and not title_matches(values[0], needle):
            continue
        found.append((sid, depth))
        if len(found) > cap:
            raise _too_many(cap)
    return _by_depth(found)


def auto_candidates(
    store: Store,
    *,
    idle_seconds: float,
    now: int | None = None,
    cwd: str | None = None,
    limit: int | None = None,
) -> tuple[list[str], int]:
    """Sessions (not archived) idle longer than ``idle_seconds`` by the policy's clock,
    max(``updatedAt``, ``unarchivedAt``), oldest activity first, at most ``limit`` (default
    ``FLEET_BULK_FILTER_MAX``; the rest wait for the next run), ancestors first. Returns the
    ids and the cutoff (epoch ms) the clock must be older than."""
    cutoff = (store.now_ms() if now is None else now) - int(idle_seconds * 1000)
    cap = store.settings.bulk_filter_max if limit is None else limit
    where = None if cwd is None else check_cwd(cwd)
    found: list[tuple[str, int]] = []
    for sid, (unarchived,), depth in _scan(store, where, cutoff, ("unarchivedMs",)):
        if int(unarchived or 0) >= cutoff:
            continue  # unarchived by hand since: idle only from then on
        found.append((sid, depth))
        if len(found) >= cap:
            break
    return _by_depth(found), cutoff
