"""Sessions: create, read, list, delete. Archive state lives in ``orchestrator/archive.py``.

A session is stored as one Redis hash (``Keys.session``) plus its listing indexes; see
``orchestrator/keys.py`` for the schema. Wire shapes follow ACP ``SessionInfo`` (acp.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator import audit, limits, untrusted
from orchestrator.errors import InputRejected, InvalidParams, SessionNotFound, TurnStopped
from orchestrator.fencing import StepGuard
from orchestrator.model import check_model
from orchestrator.store import Store, iso, new_id, retried
from orchestrator.usage import usage_of

#: Session ids (ours are ``sess_<hex>``; clients may only pass ids in this alphabet, so an id
#: can never reach a Redis key name with a separator or a glob in it).
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Longest page ``list_sessions`` returns.
MAX_PAGE = 200
DEFAULT_PAGE = 50
MAX_CWD_LENGTH = 4096
#: Longest title search (``q``), in characters.
MAX_QUERY = 200
#: Index entries a title search reads per page at most (it scans the listing index, newest
#: first, in batches of ``SEARCH_BATCH``); past that the page ends early with a cursor.
SEARCH_SCAN = 5_000
SEARCH_BATCH = 500


class ArchivedFilter(StrEnum):
    """The ``archived`` filter of ``session/list`` (ACP, seed 000)."""

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


def _hazard(h: dict[str, str]) -> dict[str, Any] | None:
    """The archive hazard of a stored hash, for its current archive transition only."""
    raw = h.get("archiveHazard")
    if not raw or h.get("archived") != "1" or h.get("reconcileTxn") != h.get("archiveTxn"):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Session:
    """A stored session. Times are ISO 8601 strings; ``title_source`` is ``client``,
    ``generated`` or ``""``."""

    session_id: str
    cwd: str
    title: str
    title_source: str
    parent_id: str | None
    created_at: str
    updated_at: str
    archived: bool
    archived_at: str | None
    deleted: bool
    #: When a census first found the archived session quiet (no live work in its subtree)
    #: after its current archive; ``None`` until then and for sessions not archived.
    quiet_at: str | None = None
    #: The reconciler's archive hazard (``{since, attempts, families}``): live work it could
    #: not stop after ``FLEET_RECONCILE_MAX_ATTEMPTS`` re-dispatches; ``None`` otherwise.
    archive_hazard: dict[str, Any] | None = None
    #: The model name the session asked for (``""``: the backend's default).
    model: str = ""
    #: Model tokens of all its turns: ``{"inputTokens", "outputTokens"}``.
    usage: dict[str, int] = field(default_factory=lambda: {"inputTokens": 0, "outputTokens": 0})

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> Session:
        """Build from the stored hash fields."""
        return cls(
            session_id=h["sessionId"],
            cwd=h["cwd"],
            title=h.get("title", ""),
            title_source=h.get("titleSource", ""),
            parent_id=h.get("parentId") or None,
            created_at=h["createdAt"],
            updated_at=h["updatedAt"],
            archived=h.get("archived") == "1",
            archived_at=h.get("archivedAt") or None,
            deleted=h.get("deleted") == "1",
            # quietTxn names the archive transition the quiet was observed for; an older one
            # (the session was unarchived and archived again since) says nothing.
            quiet_at=(
                h.get("quietAt") or None
                if h.get("archived") == "1" and h.get("quietTxn") == h.get("archiveTxn")
                else None
            ),
            archive_hazard=_hazard(h),
            model=h.get("model", ""),
            usage=usage_of(h),
        )

    def to_info(self) -> dict[str, Any]:
        """ACP ``SessionInfo``: sessionId, cwd, title?, updatedAt, archived, _meta."""
        info: dict[str, Any] = {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "updatedAt": self.updated_at,
            "archived": self.archived,
        }
        if self.title:
            info["title"] = self.title
        meta: dict[str, Any] = {"createdAt": self.created_at}
        if self.parent_id:
            meta["parentId"] = self.parent_id
        if self.archived_at:
            meta["archivedAt"] = self.archived_at
        if self.quiet_at:
            meta["quietAt"] = self.quiet_at
        if self.title_source:
            meta["titleSource"] = self.title_source
        if self.archive_hazard is not None:
            meta["archiveHazard"] = self.archive_hazard
        if self.model:
            meta["model"] = self.model
        meta["usage"] = dict(self.usage)
        info["_meta"] = {"agentFleet": meta}
        return info


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    sessions: list[Session]
    next_cursor: str | None


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a well-formed id; otherwise raise ``SessionNotFound``
    (a malformed id names no session) or ``InvalidParams`` when it is not a string."""
    if not isinstance(session_id, str):
        raise InvalidParams("sessionId must be a string.", {"param": "sessionId"})
    if not SESSION_ID_RE.fullmatch(session_id):
        raise SessionNotFound(session_id[:80])
    return session_id


def cwd_hash(cwd: str) -> str:
    """Stable short hash of a cwd, used in index key names (never the raw path)."""
    return hashlib.sha1(cwd.encode("utf-8")).hexdigest()[:20]


def check_cwd(cwd: object) -> str:
    """Return ``cwd`` if it is an absolute path string; raise ``InvalidParams`` otherwise."""
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise InvalidParams("cwd must be an absolute path (starting with '/').", {"param": "cwd"})
    if len(cwd) > MAX_CWD_LENGTH or "\x00" in cwd:
        raise InvalidParams(
            f"cwd must be at most {MAX_CWD_LENGTH} characters with no NUL byte.", {"param": "cwd"}
        )
    check_utf8(cwd, "cwd")
    if any(unicodedata.category(ch) == "Cc" for ch in cwd):
        # Control characters would reach terminals and logs that print the path.
        raise InvalidParams("cwd must not contain control characters.", {"param": "cwd"})
    return cwd


def check_utf8(text: str, param: str) -> str:
    """Return ``text`` if it encodes as UTF-8; raise ``InvalidParams`` for lone surrogates
    (what a JSON ``\\ud800`` escape or an undecodable file name turns into)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParams(
            f"{param} is not valid Unicode text (it contains a lone surrogate).", {"param": param}
        ) from None
    return text


def create_session(
    store: Store,
    cwd: str,
    parent_id: str | None = None,
    *,
    guard: StepGuard | None = None,
    model: str | None = None,
) -> Session:
    """Create a session in ``cwd`` (absolute), optionally as a subagent of ``parent_id``,
    asking for ``model`` (a model name for the backend, ``FLEET_MODEL``; a subagent given none
    takes its parent's).

    A child created under an archived lineage is born archived, in its ancestor's archive
    transition (so it is hidden and gated with it, and restored with it). With ``guard`` (the
    copy of the step that spawns the subagent) nothing is created once its turn no longer runs
    or that copy no longer owns the step (``orchestrator/fencing.py``).
    Raises ``InvalidParams`` (bad cwd), ``SessionNotFound`` (unknown or deleted parent),
    ``TurnStopped`` (the guarding turn stopped or its copy was superseded), ``LimitReached``
    (a subagent deeper than ``FLEET_MAX_SUBAGENT_DEPTH``, or beyond the parent's
    ``FLEET_MAX_SUBAGENTS_PER_SESSION`` live subagents; counted in the creating script),
    ``StoreUnavailable``.
    """
    check_cwd(cwd)
    if parent_id is not None:
        check_session_id(parent_id)
    model = check_model(model)
    sid = new_id("sess")
    ms = store.now_ms()
    caps = [limits.SUBAGENT_DEPTH.maximum(), limits.SUBAGENTS_PER_SESSION.maximum()]
    args = [sid, cwd, cwd_hash(cwd), parent_id or "", ms, iso(ms), *StepGuard.argv(guard)]
    result = store.run("create_session", [*args, *caps, model], durable=True)
    if result[0] == "stopped":
        raise TurnStopped(guard.turn_id if guard else "")
    if result[0] == "parent_not_found":
        raise SessionNotFound(parent_id or "")
    if result[0] == "limit":
        depth = result[1] == "depth"
        limit = limits.SUBAGENT_DEPTH if depth else limits.SUBAGENTS_PER_SESSION
        raise limit.reached(caps[0] if depth else caps[1], int(result[2]))
    return get_session(store, sid)


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
    return Session.from_hash(h)


def normalize_query(q: object) -> str | None:
    """The needle of a title search: ``q`` in NFC, trimmed and case-folded; ``None`` for no
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
    needle = unicodedata.normalize("NFC", q).strip().casefold()
    return needle or None


def title_matches(title: str | None, needle: str) -> bool:
    """Whether ``needle`` (from ``normalize_query``) is a case-insensitive substring of the
    title; an untitled session matches no search."""
    return bool(title) and needle in unicodedata.normalize("NFC", title or "").casefold()


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
    except (binascii.Error, ValueError, UnicodeDecodeError):
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
    exact absolute path or ``None``; ``cursor``: an opaque ``nextCursor`` from an earlier page
    of the same listing; ``limit``: 1..``MAX_PAGE``; ``q``: a title search (case-insensitive
    substring; see ``_search_page``). Deleted sessions never appear.
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
    return Page([s for s in sessions if s is not None and not s.deleted], next_cursor)


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
    return [Session.from_hash(h) if h else None for h in pipe.execute()]


MAX_CONVERSATION = 1000


def conversation(store: Store, session_id: str, limit: int = 200) -> list[dict[str, Any]]:
    """The last ``limit`` (1..``MAX_CONVERSATION``) ``session/update`` payloads of a session's
    conversation, oldest first (what ACP ``session/load`` replays). Archived sessions keep
    theirs. Raises ``SessionNotFound``, ``InvalidParams`` (bad limit), ``StoreUnavailable``."""
    if not 1 <= limit <= MAX_CONVERSATION:
        raise InvalidParams(f"limit must be between 1 and {MAX_CONVERSATION}.", {"param": "limit"})
    get_session(store, session_id)
    raw: list[str] = _history_tail(store, session_id, limit)
    return [json.loads(item) for item in raw]


@retried
def _history_tail(store: Store, session_id: str, limit: int) -> list[str]:
    found: list[str] = store.redis.lrange(store.keys.history(session_id), -limit, -1)
    return found


def delete_session(store: Store, session_id: str) -> bool:
    """Delete a session without looking at its work (``orchestrator.deletion.delete`` is the
    interfaces' delete, which refuses to hide live work): it leaves every listing and its
    steps are refused. Idempotent (``False`` when there was nothing to delete). A deletion is
    recorded in the audit trail. Raises ``StoreUnavailable``."""
    return write_delete(store, session_id, check_live=False) == "deleted"


def write_delete(store: Store, session_id: str, *, check_live: bool) -> str:
    """The delete's one write. Returns ``deleted``, ``missing`` (nothing to delete) or, with
    ``check_live``, ``active`` (the session or a descendant has live work; nothing written).
    Raises ``StoreUnavailable``."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        return "missing"
    when = iso(store.now_ms())
    outcome: str = store.run(
        "delete_session", [session_id, when, "1" if check_live else "0"], durable=True
    )
    if outcome == "deleted":
        audit.record(store, session_id, "delete", "deleted")
    return outcome


def descendants(store: Store, session_id: str) -> list[str]:
    """Ids of every descendant of the session, any depth, breadth first (deleted included)."""
    out: list[str] = []
    level = [session_id]
    while level:
        pipe = store.redis.pipeline(transaction=False)
        for sid in level:
            pipe.smembers(store.keys.children(sid))
        nxt: list[str] = []
        for members in pipe.execute():
            nxt.extend(sorted(members))
        out.extend(nxt)
        level = nxt
    return out
