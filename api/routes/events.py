"""``GET /events``: the fleet's lifecycle events as Server-Sent Events (framed by
``sse-starlette``).

Events (archived, unarchived, title, turn, deleted) are read from the capped Redis stream
``Keys.event_stream`` that ``orchestrator.storage.events`` appends to, so a client that reconnects
misses nothing still retained: each SSE event's ``id:`` is its stream id, and a request with
``Last-Event-ID`` (the header browsers send on reconnect, or the ``lastEventId`` query
parameter) resumes right after it. Without one, the stream starts at the newest event (only
later ones are sent). If the resume id is older than the oldest event kept (the stream holds
about 10,000) and events were trimmed, an ``event: gap`` is sent first: some events after the
resume id may be gone, so re-read state (``GET /sessions``). A stream never trimmed has lost
nothing, so resuming from ``0-0`` replays it without one. ``?sessionId=`` keeps only that
session's events (one that names no session, unknown or deleted, answers 404 before the stream
opens, unless the client resumes from before a deleted session's ``deleted`` event still in the
stream: it reads that event); such a stream ends after the session's ``deleted`` event, since
nothing of it can follow. Browsers' ``EventSource`` cannot send an ``Authorization`` header, so
this route alone also takes the token as ``?token=`` (checked in ``api.deps.authorize``, in
constant time).

Each event is ``id: <stream id>``, ``event: <type>``, ``data: <JSON>`` (``{"type", "sessionId",
...}``). The stream opens with the comment ``: connected`` and gets a comment ``: heartbeat``
every ``HEARTBEAT_SECONDS`` (15 s), which keeps proxies from closing it and lets the
server notice a client that left. Reads use ``redis.asyncio`` (``XREAD BLOCK``), one connection
per stream, so an API process serves at most ``FLEET_API_MAX_EVENT_STREAMS`` (500) streams at
once: one more answers 503 ``too_many_streams`` (``Retry-After``) before it touches Redis, and
never exhausts Redis's ``maxclients`` for the whole fleet. Each read blocks at most
``MAX_BLOCK_MS``, well inside the connection's socket timeout ``SOCKET_TIMEOUT``, so an idle
stream on a healthy Redis never times out on its own block, while a frozen Redis is still
noticed. When Redis fails mid-stream
the client gets ``: store unavailable, retrying`` and the read is retried every second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import redis
import redis.asyncio as aioredis
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from api.deps import AUTH, SettingsDep, StoreDep
from api.errors import error_body
from orchestrator import untrusted
from orchestrator.errors import InvalidParams, SessionNotFound
from orchestrator.session.sessions import SESSION_ID_RE, get_session
from orchestrator.storage.events import deleted_after
from orchestrator.storage.redisconn import SentinelOptions, async_client, store_unavailable
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

_STREAM_ID = re.compile(r"^([0-9]{1,20})-([0-9]{1,20})$")
#: Largest value of either part of a Redis stream id (unsigned 64-bit).
_MAX_PART = 2**64 - 1
#: Entries read per XREAD.
_READ_COUNT = 200
#: Seconds to wait before reading again after Redis failed mid-stream.
_RETRY_SECONDS = 1.0
#: Seconds a reply may take on the stream's connection before Redis counts as unavailable.
SOCKET_TIMEOUT = 5.0
#: Longest ``XREAD BLOCK``, in milliseconds: shorter than ``SOCKET_TIMEOUT`` by a margin, so a
#: read that blocks for its whole period on a healthy Redis is answered (empty) before the
#: socket timeout could fire.
MAX_BLOCK_MS = int((SOCKET_TIMEOUT - 2.0) * 1000)
#: Line separator of the frames (``\n``, as the stream has always used).
_SEP = "\n"
#: Seconds between two heartbeat comments on an idle stream (``create_app`` may set another).
HEARTBEAT_SECONDS = 15.0

router = APIRouter(dependencies=AUTH, tags=["events"])


class StreamSlots:
    """How many event streams an application has open, against its limit
    (``FLEET_API_MAX_EVENT_STREAMS``). Used on the application's event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> _Slot | None:
        """A slot for one more stream, or ``None`` when ``limit`` are open."""
        if self.open >= self.limit:
            return None
        self.open += 1
        return _Slot(self)


class _Slot:
    """One open stream's place; ``release`` gives it back once, however often called."""

    def __init__(self, slots: StreamSlots) -> None:
        self._slots: StreamSlots | None = slots

    def release(self) -> None:
        if self._slots is not None:
            self._slots.open -= 1
            self._slots = None


def _slots(request: Request, limit: int) -> StreamSlots:
    found: StreamSlots | None = getattr(request.app.state, "event_streams", None)
    if found is None:
        found = request.app.state.event_streams = StreamSlots(limit)
    return found


def _too_many(limit: int) -> JSONResponse:
    message = (
        f"This API process already serves {limit} event streams "
        "(FLEET_API_MAX_EVENT_STREAMS); try again later or close another stream."
    )
    body = error_body("too_many_streams", message, {"limit": limit})
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})


def _parse_id(value: str, param: str) -> tuple[int, int]:
    found = _STREAM_ID.fullmatch(value.strip())
    if found is None or max(int(found.group(1)), int(found.group(2))) > _MAX_PART:
        raise InvalidParams(
            f"{param} must be the id of an earlier event (such as 1700000000000-0).",
            {"param": param},
        )
    return int(found.group(1)), int(found.group(2))


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """``XREAD`` entries from a RESP2 (list of ``[name, entries]``) or RESP3 (``{name:
    [entries]}``) reply."""
    if not reply:
        return []
    if isinstance(reply, dict):
        groups = [value[0] if value else [] for value in reply.values()]
    else:
        groups = [entries for _name, entries in reply]
    return [(str(i), dict(f)) for entries in groups for i, f in entries]


async def _ends(client: aioredis.Redis, key: str) -> tuple[str | None, str | None, bool]:
    """The stream's oldest and newest entry ids (``None`` when it is empty or absent) and
    whether it may ever have lost an entry (trimmed or deleted). ``XINFO STREAM`` tells all
    three at once on Redis >= 7 (``entries-added`` beside ``length``); where it cannot (an
    older server, a user not allowed the command), the ends are read with ``XRANGE`` and the
    stream counts as trimmed."""
    try:
        info = await client.xinfo_stream(key)
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower():
            return None, None, False
        oldest = await client.xrange(key, "-", "+", count=1)
        newest = await client.xrevrange(key, "+", "-", count=1)
        return (
            str(oldest[0][0]) if oldest else None,
            str(newest[0][0]) if newest else None,
            True,
        )
    first, last = info.get("first-entry"), info.get("last-entry")
    added = info.get("entries-added")
    lost = added is None or int(added) > int(info.get("length", 0))
    return (str(first[0]) if first else None), (str(last[0]) if last else None), lost


async def _start(
    client: aioredis.Redis, key: str, resume: str | None
) -> tuple[str, dict[str, str] | None]:
    """Where reading starts, and the ``gap`` notice to send first (or ``None``): a gap only
    when the resume id is older than the oldest entry and the stream has lost entries, so a
    resume from ``0-0`` on a stream never trimmed replays it all without one."""
    oldest, newest, lost = await _ends(client, key)
    if resume is None:
        return newest or "0-0", None
    if lost and oldest and _parse_id(oldest, "") > _parse_id(resume, "Last-Event-ID"):
        return resume, {"lastEventId": resume, "oldestId": oldest}
    if newest and _parse_id(resume, "Last-Event-ID") > _parse_id(newest, ""):
        # An id from the future (another fleet's, or made up): nothing would ever follow it.
        # Say so and go on from the newest event, so the client's next id is a real one.
        return newest, {"lastEventId": newest, "unknownId": resume}
    return resume, None


def _event(entry_id: str, payload: str, session_id: str | None) -> ServerSentEvent | None:
    """The SSE event of one stream entry, or ``None`` when it is skipped (unreadable, or of
    another session than ``session_id``)."""
    try:
        event = untrusted.stored(payload)
    except ValueError:
        log.warning("unreadable event %s skipped", entry_id)
        return None
    if not isinstance(event, dict):
        return None
    if session_id is not None and event.get("sessionId") != session_id:
        return None
    kind = str(event.get("type") or "message")
    # A JSON payload has no raw newline, so one data line carries it whole.
    return ServerSentEvent(payload, id=entry_id, event=kind, sep=_SEP)


async def _stream(
    client: aioredis.Redis,
    key: str,
    cursor: str,
    gap: dict[str, str] | None,
    session_id: str | None,
    slot: _Slot,
) -> AsyncIterator[ServerSentEvent]:
    """The events after ``cursor`` (``gap`` first when given), read until the client leaves
    or, for one session's stream, until its ``deleted`` event has been sent; closes ``client``
    and releases ``slot`` at the end."""
    try:
        yield ServerSentEvent(comment="connected", sep=_SEP)
        if gap is not None:
            payload = json.dumps({"type": "gap", **gap})
            yield ServerSentEvent(payload, id=cursor, event="gap", sep=_SEP)
        while True:
            try:
                reply = await client.xread({key: cursor}, count=_READ_COUNT, block=MAX_BLOCK_MS)
            except redis.RedisError as exc:
                log.warning("event stream read failed: %s; retrying", exc)
                yield ServerSentEvent(comment="store unavailable, retrying", sep=_SEP)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            for entry_id, fields in _entries(reply):
                cursor = entry_id
                event = _event(entry_id, fields.get("event", ""), session_id)
                if event is not None:
                    yield event
                    if session_id is not None and event.event == "deleted":
                        return  # the session is gone: nothing more of it will come
    finally:
        slot.release()
        await client.aclose()


def _streamable(store: Store, session_id: str, resume: str | None) -> None:
    """Raise ``SessionNotFound`` unless ``session_id`` is a session, or a deleted one whose
    ``deleted`` event still follows ``resume`` in the stream (only a deleted session's id is
    looked for there, so an unknown id costs no read of the stream)."""
    try:
        get_session(store, session_id)
        return
    except SessionNotFound:
        if resume is None:
            raise
    get_session(store, session_id, include_deleted=True)  # an unknown id: 404 here
    if not deleted_after(store, session_id, resume):
        raise SessionNotFound(session_id)


def _resume_id(header: str | None, query: str | None) -> str | None:
    """The id to resume after (the header wins), checked; raises ``InvalidParams``."""
    resume = header if header is not None else query
    if resume is None:
        return None
    resume = resume.strip()
    _parse_id(resume, "Last-Event-ID" if header is not None else "lastEventId")
    return resume


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def events(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    sessionId: Annotated[str | None, Query(description="Only this session's events.")] = None,
    lastEventId: Annotated[
        str | None,
        Query(description="Resume after this event id (as the Last-Event-ID header)."),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", description="Resume after this event id."),
    ] = None,
) -> Response:
    """Lifecycle events (archived, unarchived, title, turn, deleted) as Server-Sent Events;
    each ``id:`` is a stream id, and reconnecting with ``Last-Event-ID`` resumes after it. A
    comment heartbeat is sent every 15 s. ``event: gap`` first means events after the
    given id were trimmed (the stream keeps about 10,000). ``sessionId`` of no session
    (unknown or deleted; archived ones stream): 404 ``session_not_found``, unless resuming
    from before a deleted session's ``deleted`` event; a ``sessionId`` stream ends after that
    session's ``deleted`` event. More than ``FLEET_API_MAX_EVENT_STREAMS`` streams open on
    this process: 503 ``too_many_streams`` with ``Retry-After``."""
    resume = _resume_id(last_event_id, lastEventId)
    if sessionId is not None:
        if not SESSION_ID_RE.fullmatch(sessionId):
            raise InvalidParams("sessionId is not a session id.", {"param": "sessionId"})
        # A session that does not exist would stream nothing, forever: 404, as elsewhere;
        # except for a client resuming before the session's `deleted` event, which it may
        # still read (its stream then ends after it).
        await asyncio.to_thread(_streamable, store, sessionId, resume)
    slot = _slots(request, settings.api_max_event_streams).take()
    if slot is None:
        return _too_many(settings.api_max_event_streams)
    key = store.keys.event_stream
    client = async_client(
        store.url,
        SentinelOptions.from_settings(settings),
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT,
    )
    try:
        cursor, gap = await _start(client, key, resume)
    except BaseException as exc:
        slot.release()
        await client.aclose()
        if isinstance(exc, redis.RedisError):
            raise store_unavailable(exc) from exc
        raise

    async def release() -> None:  # also when the stream never started (the client left)
        slot.release()
        await client.aclose()

    return EventSourceResponse(
        _stream(client, key, cursor, gap, sessionId, slot),
        background=BackgroundTask(release),
        headers={"Cache-Control": "no-cache"},
        ping=request.app.state.sse_heartbeat_seconds,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat", sep=_SEP),
        sep=_SEP,
    )
