"""The ACP methods: one handler each, called with its params already validated (``params``),
and the tables ``METHODS`` and ``NOTIFICATIONS`` naming them. A new method is one handler
here and one entry in a table. Handlers raise domain errors (``orchestrator/errors.py``);
the JSON-RPC layer maps them to codes through ``api/errors.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from api.acp import params as p
from api.acp.prompts import Prompts
from api.acp.rpc import INVALID_REQUEST, Method, RpcError
from api.acp.stream import Streams, call_store
from orchestrator.agents.definitions import agent_for
from orchestrator.archiving import archive, deletion
from orchestrator.census import activity
from orchestrator.errors import InvalidParams
from orchestrator.families import Dispatcher
from orchestrator.session import sessions, titles
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from orchestrator.turn import turns


class AcpConnection(Protocol):
    """What a handler uses of the connection it serves (``connection.AcpConnection``)."""

    store: Store
    dispatcher: Dispatcher
    prompts: Prompts
    streams: Streams

    async def cancel_turns(self, sid: str, turn_ids: list[str] | None = None) -> int: ...

    async def cancel_request(self, request_id: Any) -> None: ...


PROTOCOL_VERSION = 1
#: Page size of ``session/list``.
LIST_PAGE = 50
#: How often a pending prompt checks its turn, in seconds, in case the turn's event was lost.
_PROMPT_POLL = 2.0

AGENT_CAPABILITIES: dict[str, Any] = {
    "loadSession": True,
    "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
    "sessionCapabilities": {
        "list": {},
        "delete": {},
        "close": {},
        "resume": {},
        "archive": {},
        "title": {},
        "setTitle": {},
    },
}


async def initialize(conn: AcpConnection, req: p.InitializeRequest) -> dict[str, Any]:
    """The highest protocol version supported that is not higher than asked (1)."""
    return {
        "protocolVersion": min(max(req.protocol_version, 1), PROTOCOL_VERSION),
        "agentCapabilities": AGENT_CAPABILITIES,
        "authMethods": [],
        "agentInfo": {"name": "agent-fleet", "version": "0.1.0"},
    }


async def new_session(conn: AcpConnection, req: p.schema.NewSessionRequest) -> dict[str, Any]:
    # _meta.agentFleet.idempotencyKey: a retry with it answers the session the first created.
    key = p.idempotency_key(req.field_meta)
    agent = agent_for(conn.store.settings, p.agent_name(req.field_meta))
    session = await call_store(
        sessions.create_session, conn.store, req.cwd, idempotency_key=key, agent=agent
    )
    await conn.streams.open_session(session.session_id, 0)
    return {"sessionId": session.session_id}


async def _openable(conn: AcpConnection, sid: str) -> str:
    """``sid`` if it may be loaded or resumed; raises ``SessionNotFound``, ``SessionArchived``."""
    session: sessions.Session = await call_store(sessions.get_session, conn.store, sid)
    if session.archived:
        raise await call_store(sessions.archived_refusal, conn.store, sid)
    return sid


async def load_session(conn: AcpConnection, req: p.schema.LoadSessionRequest) -> dict[str, Any]:
    """Replay the conversation as updates, then answer; live updates follow the replay."""
    sid = await _openable(conn, req.session_id)
    if conn.streams.loading(sid):
        raise RpcError(INVALID_REQUEST, "session/load of this session is already running.")
    await conn.streams.replay(sid)
    return {}


async def resume_session(conn: AcpConnection, req: p.schema.ResumeSessionRequest) -> dict[str, Any]:
    await conn.streams.open_session(await _openable(conn, req.session_id))
    return {}


async def close_session(conn: AcpConnection, req: p.schema.CloseSessionRequest) -> dict[str, Any]:
    sid = req.session_id
    await call_store(sessions.get_session, conn.store, sid)
    cancelled = await conn.cancel_turns(sid)
    conn.streams.close_session(sid)
    await call_store(audit.record, conn.store, sid, "close", "closed", cancelledTurns=cancelled)
    return {}


async def delete_session(conn: AcpConnection, req: p.schema.DeleteSessionRequest) -> dict[str, Any]:
    # Like session/close, then freed: the session's work (its subtree's) is stopped as
    # session/archive stops it, and the session is deleted once that work has ended; work
    # that outlives the wait answers -32003 with the live items (nothing is hidden).
    sid = req.session_id
    await call_store(deletion.delete, conn.store, conn.dispatcher, sid, stop_activity=True)
    conn.streams.close_session(sid)
    return {}


async def list_sessions(conn: AcpConnection, req: p.ListSessionsRequest) -> dict[str, Any]:
    page = await call_store(
        sessions.list_sessions,
        conn.store,
        archived=req.archived,
        cwd=req.cwd,
        cursor=req.cursor,
        limit=LIST_PAGE,
    )
    result: dict[str, Any] = {"sessions": [s.to_info() for s in page.sessions]}
    if page.next_cursor:
        result["nextCursor"] = page.next_cursor
    return result


async def archive_session(conn: AcpConnection, req: p.ArchiveSessionRequest) -> dict[str, Any]:
    # On ACP the protocol's rule wins: an active session has its work stopped (as if
    # session/close were called) and is archived, unless the client says
    # `"stopActivity": false` (then a busy session is refused, -32003 with its live items, as
    # REST refuses it). Every connection with it open is told and closes it when the
    # archive's event arrives.
    stop = req.stop_activity is not False
    await call_store(
        archive.archive, conn.store, conn.dispatcher, req.session_id, stop_activity=stop
    )
    return {}


async def unarchive_session(conn: AcpConnection, req: p.UnarchiveSessionRequest) -> dict[str, Any]:
    await call_store(archive.unarchive, conn.store, req.session_id)
    return {}


async def set_title(conn: AcpConnection, req: p.SetSessionTitleRequest) -> dict[str, Any]:
    # A missing title is the same mistake as a null one: -32602 "Title must not be empty."
    stored = await call_store(titles.set_title, conn.store, req.session_id, req.title)
    return {"title": stored}


def _prompt_text(req: p.schema.PromptRequest) -> str:
    """The prompt's text blocks (and resource links, as their URI), one per line."""
    if not req.prompt:
        raise InvalidParams(
            "prompt must be a non-empty array of content blocks.", {"param": "prompt"}
        )
    texts = []
    for block in req.prompt:
        if isinstance(block, p.schema.TextContentBlock):
            texts.append(block.text)
        elif isinstance(block, p.schema.ResourceContentBlock):
            texts.append(block.uri)
        else:
            raise InvalidParams(
                f"content blocks of type {block.type!r} are not supported; send text.",
                {"param": "prompt"},
            )
    return "\n".join(texts)


async def prompt(conn: AcpConnection, req: p.schema.PromptRequest) -> dict[str, Any]:
    """Start a turn and answer its ``stopReason`` once every update of it has been sent. With
    ``_meta.agentFleet.idempotencyKey``, a retry follows the turn the first request started
    (to its end) instead of starting another."""
    sid, text = req.session_id, _prompt_text(req)
    key = p.idempotency_key(req.field_meta)
    session: sessions.Session = await call_store(sessions.get_session, conn.store, sid)
    if session.archived:
        raise await call_store(sessions.archived_refusal, conn.store, sid)
    await conn.streams.open_session(sid)  # before the turn exists: its updates are all sent
    conn.prompts.begin(sid)
    tid: str | None = None
    try:
        tid = started = await call_store(
            turns.start_turn, conn.store, conn.dispatcher, sid, text, idempotency_key=key
        )
        future = conn.prompts.track(sid, started)
        if conn.prompts.take_cancel(sid):  # cancelled before its turn was tracked
            await conn.cancel_turns(sid, [started])
        # The event normally settles the future; the poll covers a lost event.
        while not (await asyncio.wait({future}, timeout=_PROMPT_POLL))[0]:
            turn = await call_store(turns.get_turn, conn.store, started)
            if turn is not None and turn.state not in turns.LIVE_STATES:
                # Its event was lost (or the session was closed here): let the forwarder
                # send the turn's updates and settle the prompt, as the event would have.
                conn.streams.inject(_turn_event(sid, started, turn.state))
        return {"stopReason": future.result()}
    finally:
        conn.prompts.finish(sid, tid)
        conn.streams.release(sid)  # closed while the prompt ran: stop watching now


def _turn_event(sid: str, tid: str, state: turns.TurnState) -> dict[str, Any]:
    """The ``turn`` event that reports ``tid`` ended in ``state``."""
    return {
        "type": "turn",
        "sessionId": sid,
        "turnId": tid,
        "state": state.value,
        "stopReason": turns.STOP_REASON[state],
    }


async def cancel(conn: AcpConnection, req: p.schema.CancelNotification) -> None:
    # ACP session/cancel: the client cancels its prompt turn in flight on this session,
    # never a turn another client (or a later prompt of its own) started since.
    await conn.cancel_turns(req.session_id, conn.prompts.cancel(req.session_id))


async def cancel_request(conn: AcpConnection, req: p.CancelRequestNotification) -> None:
    await conn.cancel_request(req.request_id)


async def session_activity(conn: AcpConnection, req: p.ActivityRequest) -> dict[str, Any]:
    items = await call_store(activity.census, conn.store, req.session_id)
    return {"activity": [i.to_wire() for i in items]}


METHODS: dict[str, Method] = {
    "initialize": Method(p.InitializeRequest, initialize),
    "session/new": Method(p.schema.NewSessionRequest, new_session),
    "session/load": Method(p.schema.LoadSessionRequest, load_session),
    "session/resume": Method(p.schema.ResumeSessionRequest, resume_session),
    "session/close": Method(p.schema.CloseSessionRequest, close_session),
    "session/delete": Method(p.schema.DeleteSessionRequest, delete_session),
    "session/list": Method(p.ListSessionsRequest, list_sessions),
    "session/archive": Method(p.ArchiveSessionRequest, archive_session),
    "session/unarchive": Method(p.UnarchiveSessionRequest, unarchive_session),
    "session/set_title": Method(p.SetSessionTitleRequest, set_title),
    "session/prompt": Method(p.schema.PromptRequest, prompt),
    "_agentFleet/activity": Method(p.ActivityRequest, session_activity),
}
NOTIFICATIONS: dict[str, Method] = {
    "session/cancel": Method(p.schema.CancelNotification, cancel),
    "$/cancel_request": Method(p.CancelRequestNotification, cancel_request),
}
