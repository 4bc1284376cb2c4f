"""Listing sessions: ``session/list`` (ACP) filtered by archive state, cwd and a title
search, newest activity first, paged by opaque cursors.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import unicodedata
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator import untrusted
from orchestrator.errors import DuplicateKey, InputRejected, InvalidParams
from orchestrator.session.session_record import Session, check_cwd, check_utf8, cwd_hash
from orchestrator.storage.store import Store, retried

#: Longest page ``list_sessions`` returns.
MAX_PAGE = 200
DEFAULT_PAGE = 50
#: Longest title search (``q``), in characters.
MAX_QUERY = 200
#: Index entries a title search reads per page at most (it scans the listing index, newest
#: first, in batches of ``SEARCH_BATCH``); past that the page ends early with a cursor.
SEARCH_SCAN = 5_000
SEARCH_BATCH = 500


class ArchivedFilter(StrEnum):
    """The ``archived`` filter of ``session/list`` (ACP)."""

    EXCLUDE = "exclude"  #: only sessions that are not archived (the default)
    INCLUDE = "include"  #: archived and not archived
    ONLY = "only"  #: only archived sessions

    @classmethod
    def parse(cls, value: object) -> ArchivedFilter:
        """Parse a wire value: ``None`` -> EXCLUDE; one of the three strings; anything else
        (booleans, other strings, numbers) raises ``InvalidParams``."""
        if value is None:
            return cls.EXCLUDE
        if isinstance(value, str):
            for member in cls:
                if member.value == value:
                    return member
        raise InvalidParams(
            f"archived must be one of 'exclude', 'include' or 'only' (got {json.dumps(value)}).",
            {"param": "archived", "allowed": [m.value for m in cls]},
        )

    @property
    def index_state(self) -> str:
        """The listing index this filter reads (``active``, ``all`` or ``archived``)."""
        return {"exclude": "active", "include": "all", "only": "archived"}[self.value]

    def admits(self, session: Session) -> bool:
        """Whether a session read after its index entry still belongs in this listing: not
        deleted and, for EXCLUDE/ONLY, in the archive state the filter asks for. The index
        and the hashes are read in two round trips, so an archive or unarchive in between
        can leave a stale index entry; such a row is left out."""
        if session.deleted:
            return False
        if self is ArchivedFilter.INCLUDE:
            return True
        return session.archived is (self is ArchivedFilter.ONLY)


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    sessions: list[Session]
    next_cursor: str | None


def normalize_query(q: object) -> str | None:
    """The needle of a title search: ``q`` trimmed and folded (``_fold``); ``None`` for no
    search (``None`` or blank). Raises ``InvalidParams`` when ``q`` is not a string, is longer
    than ``MAX_QUERY`` characters or is not valid Unicode text."""
    if q is None:
        return None
    if not isinstance(q, str):
        raise InvalidParams("q must be a string.", {"param": "q"})
    if len(q) > MAX_QUERY:
        raise InvalidParams(
            f"q is longer than {MAX_QUERY} characters.", {"param": "q", "maxLength": MAX_QUERY}
        )
    check_utf8(q, "q")
    needle = _fold(q.strip())
    return needle or None


def _fold(text: str) -> str:
    """``text`` in NFC, case-folded, with the dot that folding leaves after an ``i`` (from
    the dotted capital ``İ``, U+0130) dropped, so ``İstanbul``, ``ISTANBUL`` and
    ``istanbul`` fold alike."""
    return unicodedata.normalize("NFC", text).casefold().replace("i\u0307", "i")


def title_matches(title: str | None, needle: str) -> bool:
    """Whether ``needle`` (from ``normalize_query``) is a case-insensitive substring of the
    title (both folded by ``_fold``); an untitled session matches no search."""
    return bool(title) and needle in _fold(title or "")


def _encode_cursor(
    flt: ArchivedFilter, cwd: str | None, score: float, sid: str, q: str | None = None
) -> str:
    data: dict[str, Any] = {"a": flt.value, "c": cwd, "s": score, "i": sid}
    if q is not None:
        data["q"] = q
    raw = json.dumps(data, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(
    cursor: object, flt: ArchivedFilter, cwd: str | None, q: str | None = None
) -> tuple[float, str]:
    bad = InvalidParams(
        "cursor is not valid for this listing; start again without a cursor.", {"param": "cursor"}
    )
    if not isinstance(cursor, str) or not cursor or len(cursor) > 8192:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = untrusted.loads(raw, param="cursor")
    except InputRejected as exc:
        # Still a bad cursor, but say which limit it broke.
        raise InputRejected(f"{exc.message} {bad.message}", exc.data) from None
    except (binascii.Error, ValueError, UnicodeDecodeError, DuplicateKey):
        raise bad from None
    if not isinstance(data, dict) or data.get("a") != flt.value or data.get("c") != cwd:
        raise bad
    if data.get("q") != q:
        raise bad
    score, sid = data.get("s"), data.get("i")
    if not isinstance(score, (int, float)) or isinstance(score, bool) or not isinstance(sid, str):
        raise bad
    try:
        value = float(score)
    except OverflowError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    return value, sid


@retried
def _page_ids(
    store: Store, key: str, after: tuple[float, str] | None, limit: int
) -> list[tuple[str, float]]:
    """Up to ``limit`` (id, score) pairs from ``key``, newest first, strictly after ``after``
    in (score desc, id desc) order."""
    if after is None:
        rows = store.redis.zrevrange(key, 0, limit - 1, withscores=True)
        return [(m, s) for m, s in rows]
    score, last = after
    out: list[tuple[str, float]] = []
    offset = 0
    while len(out) < limit:
        batch = limit + 16
        rows = store.redis.zrevrangebyscore(
            key, score, "-inf", start=offset, num=batch, withscores=True
        )
        for member, s in rows:
            # Equal scores come in reverse lexicographic order: those >= last were served.
            if s < score or member < last:
                out.append((member, s))
                if len(out) == limit:
                    break
        if len(rows) < batch:
            break
        offset += batch
    return out


def list_sessions(
    store: Store,
    *,
    archived: object = None,
    cwd: object = None,
    cursor: object = None,
    limit: int = DEFAULT_PAGE,
    q: object = None,
) -> Page:
    """List sessions newest activity first, filtered before pagination (ACP ``session/list``).

    ``archived``: ``exclude`` (default, also for ``None``), ``include`` or ``only``; ``cwd``:
    an absolute path, compared in normal form (``session_record.check_cwd``), or ``None``;
    ``cursor``: an opaque ``nextCursor`` from an earlier page of the same listing; ``limit``:
    1..``MAX_PAGE``; ``q``: a title search (case-insensitive substring; see
    ``_search_page``). Deleted sessions never appear.
    Raises ``InvalidParams`` for a bad filter, cwd, q or cursor; ``StoreUnavailable``.
    """
    flt = ArchivedFilter.parse(archived)
    cwd_value = None if cwd is None else check_cwd(cwd)
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidParams(f"limit must be between 1 and {MAX_PAGE}.", {"param": "limit"})
    needle = normalize_query(q)
    after = None if cursor is None else _decode_cursor(cursor, flt, cwd_value, needle)
    key = store.keys.index(flt.index_state, None if cwd_value is None else cwd_hash(cwd_value))
    if needle is not None:
        found, resume = _search_page(store, key, after, limit, needle)
        found = [s for s in found if flt.admits(s)]
        token = None if resume is None else _encode_cursor(flt, cwd_value, *resume, needle)
        return Page(found, token)
    rows = _page_ids(store, key, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    sessions = _load_many(store, [sid for sid, _ in rows])
    next_cursor = None
    if more and rows:
        last_id, last_score = rows[-1]
        next_cursor = _encode_cursor(flt, cwd_value, last_score, last_id)
    return Page([s for s in sessions if s is not None and flt.admits(s)], next_cursor)


@retried
def _titles(store: Store, ids: list[str]) -> list[str | None]:
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hget(store.keys.session(sid), "title")
    return list(pipe.execute())


def _search_page(
    store: Store, key: str, after: tuple[float, str] | None, limit: int, needle: str
) -> tuple[list[Session], tuple[float, str] | None]:
    """One page of a title search, filtered before pagination: a bounded scan of the listing
    index ``key`` newest first from ``after``, ``SEARCH_BATCH`` entries per round trip (plus
    one for their titles), reading at most ``SEARCH_SCAN`` entries. Returns the matching
    sessions and where the next page resumes (``None`` when the index is exhausted).

    A page is full when ``limit`` matches are found and one more match exists. When the scan
    budget runs out first, the page holds fewer matches (possibly none) and still resumes
    where the scan stopped, so following ``nextCursor`` until it is absent finds every match
    exactly once."""
    matches: list[tuple[str, float]] = []
    position = after
    scanned = 0
    while scanned < SEARCH_SCAN:
        want = min(SEARCH_BATCH, SEARCH_SCAN - scanned)
        rows = _page_ids(store, key, position, want)
        for (sid, score), title in zip(rows, _titles(store, [r[0] for r in rows]), strict=True):
            scanned += 1
            if title_matches(title, needle):
                if len(matches) == limit:  # one more exists: the page is full
                    last_id, last_score = matches[-1]
                    return _load_matches(store, matches), (last_score, last_id)
                matches.append((sid, score))
            position = (score, sid)
        if len(rows) < want:  # the index is exhausted
            return _load_matches(store, matches), None
    return _load_matches(store, matches), position


def _load_matches(store: Store, rows: list[tuple[str, float]]) -> list[Session]:
    found = _load_many(store, [sid for sid, _ in rows])
    return [s for s in found if s is not None and not s.deleted]


@retried
def _load_many(store: Store, ids: list[str]) -> list[Session | None]:
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hgetall(store.keys.session(sid))
    return [
        Session.from_hash(sid, h) if h else None for sid, h in zip(ids, pipe.execute(), strict=True)
    ]
