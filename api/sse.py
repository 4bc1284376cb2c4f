"""``GET /events``: the fleet's lifecycle events as Server-Sent Events.

Events (archived, unarchived, title, turn) are read from the capped Redis stream
``Keys.event_stream`` that ``orchestrator.events`` appends to, so a client that reconnects
misses nothing still retained: each SSE event's ``id:`` is its stream id, and a request with
``Last-Event-ID`` (the header browsers send on reconnect, or the ``lastEventId`` query
parameter) resumes right after it. Without one, the stream starts at the newest event (only
later ones are sent). If the resume id is older than the oldest event kept (the stream holds
about 10,000), an ``event: gap`` is sent first: some events were trimmed, so re-read state
(``GET /sessions``). ``?sessionId=`` keeps only that session's events. Browsers'
``EventSource`` cannot send an ``Authorization`` header, so this route alone also takes the
token as ``?token=`` (checked in ``api.rest._authorize``, in constant time).

Each event is ``id: <stream id>``, ``event: <type>``, ``data: <JSON>`` (``{"type",
"sessionId", ...}``). An idle stream gets a comment line (``: heartbeat``) every
``FLEET_SSE_HEARTBEAT_SECONDS`` (15 s), which keeps proxies from closing it and lets the
server notice a client that left. Reads use ``redis.asyncio`` (``XREAD BLOCK``), one
connection per stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import redis
import redis.asyncio as aioredis
from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from api.context import redis_url, store
from orchestrator.errors import InvalidParams, StoreUnavailable
from orchestrator.redisconn import async_client
from orchestrator.sessions import SESSION_ID_RE
from orchestrator.settings import get_settings

log = logging.getLogger(__name__)

_STREAM_ID = re.compile(r"^([0-9]{1,20})-([0-9]{1,20})$")
#: Largest value of either part of a Redis stream id (unsigned 64-bit).
_MAX_PART = 2**64 - 1
#: Entries read per XREAD.
_READ_COUNT = 200
#: Seconds to wait before reading again after Redis failed mid-stream.
_RETRY_SECONDS = 1.0


def _parse_id(value: str, param: str) -> tuple[int, int]:
    found = _STREAM_ID.fullmatch(value.strip())
    if found is None or max(int(found.group(1)), int(found.group(2))) > _MAX_PART:
        raise InvalidParams(
            f"{param} must be the id of an earlier event (such as 1700000000000-0).",
            {"param": param},
        )
    return int(found.group(1)), int(found.group(2))


def _frame(entry_id: str, kind: str, payload: str) -> str:
    # A JSON payload has no raw newline, so one data line carries it whole.
    return f"id: {entry_id}\nevent: {kind}\ndata: {payload}\n\n"


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


async def _start(
    client: aioredis.Redis, key: str, resume: str | None
) -> tuple[str, dict[str, str] | None]:
    """Where reading starts, and the ``gap`` notice to send first (or ``None``)."""
    if resume is None:
        newest = await client.xrevrange(key, "+", "-", count=1)
        return (str(newest[0][0]) if newest else "0-0"), None
    oldest = await client.xrange(key, "-", "+", count=1)
    if oldest and _parse_id(str(oldest[0][0]), "") > _parse_id(resume, "Last-Event-ID"):
        return resume, {"lastEventId": resume, "oldestId": str(oldest[0][0])}
    newest = await client.xrevrange(key, "+", "-", count=1)
    if newest and _parse_id(resume, "Last-Event-ID") > _parse_id(str(newest[0][0]), ""):
        # An id from the future (another fleet's, or made up): nothing would ever follow it.
        # Say so and go on from the newest event, so the client's next id is a real one.
        return str(newest[0][0]), {"lastEventId": str(newest[0][0]), "unknownId": resume}
    return resume, None


def router(auth: list[Any]) -> APIRouter:
    """The ``/events`` route, guarded by ``auth``."""
    r = APIRouter(dependencies=auth, tags=["events"])

    @r.get(
        "/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
    )
    async def events(
        sessionId: Annotated[str | None, Query(description="Only this session's events.")] = None,
        lastEventId: Annotated[
            str | None,
            Query(description="Resume after this event id (as the Last-Event-ID header)."),
        ] = None,
        last_event_id: Annotated[
            str | None,
            Header(alias="Last-Event-ID", description="Resume after this event id."),
        ] = None,
    ) -> StreamingResponse:
        """Lifecycle events (archived, unarchived, title, turn) as Server-Sent Events; each
        ``id:`` is a stream id, and reconnecting with ``Last-Event-ID`` resumes after it. A
        comment heartbeat is sent every 15 s. ``event: gap`` first means events after the
        given id were trimmed (the stream keeps about 10,000)."""
        if sessionId is not None and not SESSION_ID_RE.fullmatch(sessionId):
            raise InvalidParams("sessionId is not a session id.", {"param": "sessionId"})
        resume = last_event_id if last_event_id is not None else lastEventId
        if resume is not None:
            resume = resume.strip()
            _parse_id(resume, "Last-Event-ID" if last_event_id is not None else "lastEventId")
        key = store().keys.event_stream
        heartbeat = get_settings().sse_heartbeat_seconds
        client = async_client(redis_url(), decode_responses=True, socket_connect_timeout=2.0)
        try:
            last, gap = await _start(client, key, resume)
        except redis.RedisError as exc:
            await client.aclose()
            raise StoreUnavailable(type(exc).__name__ + (f" ({exc})" if str(exc) else "")) from exc

        async def stream() -> AsyncIterator[str]:
            cursor = last
            try:
                yield ": connected\n\n"
                if gap is not None:
                    yield _frame(cursor, "gap", json.dumps({"type": "gap", **gap}))
                quiet_since = time.monotonic()
                while True:
                    wait = heartbeat - (time.monotonic() - quiet_since)
                    if wait <= 0:
                        yield ": heartbeat\n\n"
                        quiet_since = time.monotonic()
                        continue
                    try:
                        reply = await client.xread(
                            {key: cursor}, count=_READ_COUNT, block=max(1, int(wait * 1000))
                        )
                    except redis.RedisError as exc:
                        log.warning("event stream read failed: %s; retrying", exc)
                        yield ": store unavailable, retrying\n\n"
                        await asyncio.sleep(_RETRY_SECONDS)
                        continue
                    for entry_id, fields in _entries(reply):
                        cursor = entry_id
                        payload = fields.get("event", "")
                        try:
                            event = json.loads(payload)
                        except ValueError:
                            log.warning("unreadable event %s skipped", entry_id)
                            continue
                        if not isinstance(event, dict):
                            continue
                        if sessionId is not None and event.get("sessionId") != sessionId:
                            continue
                        yield _frame(entry_id, str(event.get("type") or "message"), payload)
                        quiet_since = time.monotonic()
            finally:
                await client.aclose()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return r
