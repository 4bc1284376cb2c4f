"""An ACP agent for the session lifecycle, independent of its transport.

``AcpConnection`` takes JSON-RPC 2.0 messages (one JSON text each) and sends responses and
``session/update`` notifications through a ``send`` coroutine; ``api/acp_stdio.py`` (one message
per line) and the ``/acp`` WebSocket of ``api/rest.py`` (one message per frame) are thin
adapters over it. The rules followed are those of ``shared/acp.md`` (ACP v1, seeds 000/001).

Notifications reach every connection that has a session open, in every API process: domain
changes are published on Redis (``orchestrator/events.py``) and ``EventHub`` relays them. A
connection handles its events in publish order from one task (the forwarder). Conversation
updates are read from the session's history after a per-session cursor, the event only saying
that there is more, so a late or lost event never drops or repeats an update, and a
``session/load`` replay joins the live stream exactly. A prompt is settled by that same task
after its turn's final event and the updates before it, so every update of a turn reaches the
client before the ``session/prompt`` response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from api.errors import TRANSLATED, lookup, translate
from orchestrator import activity, archive, audit, deletion, sessions, titles, turns, untrusted
from orchestrator.errors import (
    InputRejected,
    InvalidParams,
    SessionArchived,
)
from orchestrator.families import Dispatcher
from orchestrator.redisconn import async_client
from orchestrator.store import Store
from orchestrator.store import translated as translated_store

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
#: Largest JSON-RPC message accepted, in bytes of text.
MAX_MESSAGE = 1_000_000
#: Page size of ``session/list``.
LIST_PAGE = 50

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
REQUEST_CANCELLED = -32800

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

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Turn states a ``turn`` event settles a pending ``session/prompt`` with.
_TERMINAL_TURN_STATES = frozenset(s.value for s in turns.STOP_REASON)
#: ``ToolCallStatus`` values of ACP v1. The orchestrator also records ``cancelled``, which
#: ACP v1 lacks; on the wire it becomes ``failed`` with the original kept in ``_meta``.
_TOOL_CALL_STATUSES = frozenset({"pending", "in_progress", "completed", "failed"})


def encode_message(message: dict[str, Any]) -> str:
    """One JSON-RPC message as JSON text, UTF-8 safe: a lone surrogate (which a client can
    send as a ``\\ud800`` escape and which an error message may echo) cannot be encoded as
    UTF-8, so such a message is written with ASCII escapes instead of failing to send."""
    text = json.dumps(message, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(message, ensure_ascii=True)
    return text


def wire_update(update: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``session/update`` payload in ACP v1 shape: the fleet's own fields
    (``turnId``, a ``cancelled`` tool-call status) move to ``_meta.agentFleet``."""
    out = dict(update)
    ours: dict[str, Any] = {}
    if "turnId" in out:
        ours["turnId"] = out.pop("turnId")
    status = out.get("status")
    if (
        out.get("sessionUpdate") in ("tool_call", "tool_call_update")
        and status is not None
        and status not in _TOOL_CALL_STATUSES
    ):
        ours["status"] = status
        out["status"] = "failed"
    if ours:
        meta = dict(out.get("_meta") or {})
        meta["agentFleet"] = {**(meta.get("agentFleet") or {}), **ours}
        out["_meta"] = meta
    return out


class RpcError(Exception):
    """A JSON-RPC error to answer with."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def _params(msg: dict[str, Any]) -> dict[str, Any]:
    params = msg.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object.")
    return params


def _session_id(params: dict[str, Any]) -> str:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise RpcError(INVALID_PARAMS, "sessionId is required and must be a string.")
    return sid


def _prompt_text(params: dict[str, Any]) -> str:
    blocks = params.get("prompt")
    if not isinstance(blocks, list) or not blocks:
        raise RpcError(INVALID_PARAMS, "prompt must be a non-empty array of content blocks.")
    texts = []
    for block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise RpcError(INVALID_PARAMS, "each prompt block must be an object with a type.")
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise RpcError(INVALID_PARAMS, "a text block needs a string 'text'.")
            texts.append(block["text"])
        elif block["type"] == "resource_link":
            texts.append(str(block.get("uri", "")))
        else:
            raise RpcError(
                INVALID_PARAMS,
                f"content blocks of type {block['type']!r} are not supported; send text.",
            )
    return "\n".join(texts)


class EventHub:
    """Relays the fleet's Redis events to the connections of this process that watch a
    session. One subscription per process, started on first use."""

    def __init__(self, url: str, channel: str) -> None:
        self.url, self.channel = url, channel
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Subscribe (once per event loop); returns when the subscription is active."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._ready = asyncio.Event()
            self._task = loop.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 10)

    async def _run(self) -> None:
        while True:
            client = async_client(self.url, decode_responses=True)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                self._ready.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        event = json.loads(message["data"])
                    except (TypeError, ValueError):
                        continue
                    for queue in list(self._watchers.get(event.get("sessionId", ""), ())):
                        queue.put_nowait(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: resubscribe after a pause
                log.warning("event relay lost its subscription: %s", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def watch(self, session_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Deliver events of ``session_id`` into ``queue``."""
        self._watchers.setdefault(session_id, set()).add(queue)

    def unwatch(self, session_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Stop delivering events of ``session_id`` into ``queue``."""
        watchers = self._watchers.get(session_id)
        if watchers is not None:
            watchers.discard(queue)
            if not watchers:
                del self._watchers[session_id]


_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventHub] = weakref.WeakKeyDictionary()


def shared_hub(url: str, channel: str) -> EventHub:
    """The event hub of the running event loop (one subscription per loop and channel).

    A hub's queues belong to its loop, so connections served by different loops (a test
    client's portal beside a server) never share one: each loop relays to its own."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get(loop)
    if hub is None or (hub.url, hub.channel) != (url, channel):
        hub = _HUBS[loop] = EventHub(url, channel)
    return hub


class AcpConnection:
    """One client connection: its open sessions, pending prompts and event forwarding."""

    def __init__(self, send: Send, store: Store, dispatcher: Dispatcher, hub: EventHub) -> None:
        self._send_raw = send
        self.store, self.dispatcher, self.hub = store, dispatcher, hub
        self.open: set[str] = set()
        # Per open session: how much of its history (Keys.history) this client has been sent.
        self._cursor: dict[str, int] = {}
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._prompts: dict[str, asyncio.Future[str]] = {}  # turnId -> stopReason
        self._prompting: dict[str, int] = {}  # sessionId -> prompts pending on it
        # sessionId -> the turns of this connection's prompts in flight (what a cancel stops).
        self._prompt_turns: dict[str, set[str]] = {}
        # Turns that ended before their prompt's future was registered (a fast turn).
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        # Requests being handled, by id (for $/cancel_request); ids cancelled that way.
        self._requests: dict[tuple[str, Any], tuple[asyncio.Task[None], str, dict[str, Any]]] = {}
        self._cancelled: set[tuple[str, Any]] = set()
        self._forwarder: asyncio.Task[None] | None = None
        # Sessions being loaded: their events wait here until the replay has been sent.
        self._loading: dict[str, list[dict[str, Any]]] = {}
        self._send_lock = asyncio.Lock()

    # -- plumbing ----------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        """Send one message (serialized: frames and lines never interleave)."""
        async with self._send_lock:
            await self._send_raw(message)

    async def _error(self, msg_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        await self.send({"jsonrpc": "2.0", "id": msg_id, "error": error})

    async def handle_text(self, text: str) -> None:
        """Handle one incoming JSON-RPC message. Never raises: a malformed message gets an
        error response and the connection goes on. JSON is read by ``orchestrator.untrusted``
        (depth, number and Unicode limits)."""
        try:
            await self._handle_text(text)
        except Exception:  # a bug of ours must not end the client's connection
            log.exception("ACP message not handled")
            await self._error(None, INTERNAL_ERROR, "Internal error; see the agent's log.")

    async def _handle_text(self, text: str) -> None:
        if len(text) > MAX_MESSAGE:
            await self._error(None, INVALID_REQUEST, f"message larger than {MAX_MESSAGE} bytes")
            return
        try:
            msg = untrusted.loads(text, param="message")
        except json.JSONDecodeError as exc:
            await self._error(None, PARSE_ERROR, f"Parse error: not valid JSON ({exc.msg}).")
            return
        except InputRejected as exc:
            await self._rejected(exc)
            return
        msg_id = msg.get("id") if isinstance(msg, dict) else None
        good_id = _good_id(msg_id)
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            await self._error(
                msg_id if good_id else None,
                INVALID_REQUEST,
                "Invalid request: expected a JSON-RPC 2.0 object.",
            )
            return
        if "method" not in msg:
            if "result" in msg or "error" in msg:
                return  # a response to a request we never send: ignore
            await self._error(
                msg_id if good_id else None,
                INVALID_REQUEST,
                "Invalid request: a request needs a method.",
            )
            return
        method = msg.get("method")
        if not isinstance(method, str) or not good_id:
            await self._error(
                msg_id if good_id else None,
                INVALID_REQUEST,
                "Invalid request: method must be a string and id a string, an integer or null.",
            )
            return
        if self._forwarder is None:
            try:
                await self.hub.start()
            except Exception as exc:  # Redis unreachable: requests still get their answers
                log.warning("event relay not subscribed yet: %s", exc)
            self._forwarder = asyncio.create_task(self._forward())
        task = asyncio.create_task(self._dispatch(method, msg, "id" in msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if "id" in msg:
            key = _id_key(msg_id)
            self._requests[key] = (task, method, msg)
            task.add_done_callback(lambda t: self._forget_request(key, t))

    async def _rejected(self, exc: InputRejected) -> None:
        """Answer a message over a parse limit: -32602 with its id when only its params
        broke the limit, -32600 when the rest of it did, -32700 when it could not be parsed
        at all (nested deeper than the parser goes)."""
        msg = exc.partial
        if not isinstance(msg, dict):
            await self._error(None, PARSE_ERROR, f"Parse error: {exc.message}", exc.data)
            return
        msg_id = msg.get("id")
        msg_id = msg_id if _good_id(msg_id) else None
        in_params = str(exc.data.get("path", "")).startswith(("$.params.", "$.params["))
        if in_params and msg_id is not None and "method" in msg:
            await self._error(msg_id, INVALID_PARAMS, f"Invalid params: {exc.message}", exc.data)
        else:
            await self._error(msg_id, INVALID_REQUEST, f"Invalid request: {exc.message}", exc.data)

    def _forget_request(self, key: tuple[str, Any], task: asyncio.Task[None]) -> None:
        if self._requests.get(key, (None,))[0] is task:
            del self._requests[key]

    async def _dispatch(self, method: str, msg: dict[str, Any], is_request: bool) -> None:
        msg_id = msg.get("id")
        handler = _METHODS.get(method) if is_request else _NOTIFICATIONS.get(method)
        try:
            if handler is None:
                if is_request:
                    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
                return
            result = await handler(self, _params(msg))
            if is_request:
                await self.send({"jsonrpc": "2.0", "id": msg_id, "result": result})
        except RpcError as exc:
            if is_request:
                await self._error(msg_id, exc.code, exc.message, exc.data)
        except TRANSLATED as exc:
            if is_request:
                error = translate(exc)
                _status, code = lookup(error)
                await self._error(msg_id, code, error.message, error.data or None)
        except UnicodeError:
            # A string with a lone surrogate (a "\ud800" escape) reached the store: the
            # client's mistake, not ours.
            if is_request:
                await self._error(
                    msg_id,
                    INVALID_PARAMS,
                    "Invalid params: strings must be valid Unicode (no lone surrogates).",
                )
        except asyncio.CancelledError:
            key = _id_key(msg_id)
            if not is_request or key not in self._cancelled:
                raise  # the connection is closing
            self._cancelled.discard(key)
            await self._error(msg_id, REQUEST_CANCELLED, "Request cancelled.")
        except Exception:
            log.exception("ACP %s failed", method)
            if is_request:
                await self._error(msg_id, INTERNAL_ERROR, "Internal error; see the agent's log.")

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for requests already received to be answered."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    async def close(self) -> None:
        """The transport closed: stop watching, cancel pending work of this connection."""
        for sid in list(self.open):
            self.hub.unwatch(sid, self.events)
        for task in list(self._tasks):
            task.cancel()
        if self._forwarder is not None:
            self._forwarder.cancel()

    async def _open(self, sid: str, cursor: int | None = None) -> None:
        """Watch ``sid``'s events; updates recorded from ``cursor`` on (default: from now)
        will be sent."""
        if sid in self.open:
            return
        self.open.add(sid)
        self.hub.watch(sid, self.events)
        if cursor is None:
            cursor = int(await self._call(self.store.redis.llen, self.store.keys.history(sid)))
            # An update recorded after the LLEN whose event came before the cursor was set
            # found no cursor: catch up through the forwarder.
            self.events.put_nowait({"type": "update", "sessionId": sid})
        self._cursor.setdefault(sid, cursor)

    def _close(self, sid: str) -> None:
        """No more updates of ``sid`` for this client. Its events stay watched while a prompt
        of this client is pending on it, so the prompt still settles from its turn's event."""
        if sid in self.open:
            self.open.discard(sid)
            self._cursor.pop(sid, None)
            if not self._prompting.get(sid):
                self.hub.unwatch(sid, self.events)

    async def _forward(self) -> None:
        """Handle events in publish order (the only task that sends live updates)."""
        while True:
            event = await self.events.get()
            held = self._loading.get(str(event.get("sessionId")))
            if held is not None:
                held.append(event)
                continue
            try:
                await self._handle_event(event)
            except Exception:  # one bad event never stops the relay
                log.exception("ACP event %s not handled", event.get("type"))

    async def _handle_event(self, event: dict[str, Any], *, loading: bool = False) -> None:
        """Send what ``event`` means to this client; settle the prompt of an ended turn.
        ``loading``: called by ``load_session`` for an event it held."""
        sid = str(event.get("sessionId"))
        kind = event.get("type")
        if kind == "update":
            # The history is the source of truth: the event says "there is more"; what is
            # sent is read from the history after this client's cursor, so an update is never
            # sent twice or skipped, even if the relay delivered its event late or lost it.
            await self._sync(sid, loading=loading)
        elif kind in ("archived", "unarchived") and sid in self.open:
            update = {"sessionUpdate": "session_info_update", "archived": kind == "archived"}
            await self._send_update(sid, update)
        elif kind == "title" and sid in self.open:
            update = {"sessionUpdate": "session_info_update", "title": event.get("title")}
            await self._send_update(sid, update)
        elif kind == "turn" and event.get("state") in _TERMINAL_TURN_STATES:
            await self._sync(sid, loading=loading)  # the turn's updates precede its answer
            reason = str(event.get("stopReason") or "end_turn")
            future = self._prompts.pop(str(event.get("turnId")), None)
            if future is None:
                self._ended[str(event.get("turnId"))] = reason
                while len(self._ended) > 256:
                    self._ended.popitem(last=False)
            elif not future.done():
                future.set_result(reason)

    async def _sync(self, sid: str, *, loading: bool = False) -> None:
        """Send the updates recorded for ``sid`` since this client's cursor. One caller at a
        time per session: the forwarder, or ``load_session`` while it holds the session."""
        start = self._cursor.get(sid)
        if start is None:
            return
        raw = await self._call(self.store.redis.lrange, self.store.keys.history(sid), start, -1)
        if self._cursor.get(sid) != start or (sid in self._loading and not loading):
            return  # closed, reopened or being loaded meanwhile: that path sends them
        self._cursor[sid] = start + len(raw)
        await self._send_history(sid, raw)

    async def _send_history(self, sid: str, raw: list[str]) -> None:
        for item in raw:
            try:
                update = json.loads(item)
            except ValueError:
                update = None
            if isinstance(update, dict):
                await self._send_update(sid, update)
            else:
                log.warning("unreadable history item of %s skipped", sid)

    async def _send_update(self, sid: str, update: dict[str, Any]) -> None:
        try:
            await self.send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": sid, "update": wire_update(update)},
                }
            )
        except Exception as exc:  # the transport is closing; keep settling prompts
            log.debug("update for %s not sent: %s", sid, exc)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a thread; a Redis failure raises ``StoreUnavailable``."""

        def run() -> Any:
            with translated_store():
                return fn(*args, **kwargs)

        return await asyncio.to_thread(run)

    # -- methods -----------------------------------------------------------------------------
    async def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        version = params.get("protocolVersion")
        if not isinstance(version, int) or isinstance(version, bool):
            raise RpcError(INVALID_PARAMS, "protocolVersion must be an integer.")
        return {
            "protocolVersion": min(max(version, 1), PROTOCOL_VERSION),
            "agentCapabilities": AGENT_CAPABILITIES,
            "authMethods": [],
            "agentInfo": {"name": "agent-fleet", "version": "0.1.0"},
        }

    async def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        sessions.check_cwd(params.get("cwd"))  # the first thing to fix, if both are wrong
        _mcp_servers(params)
        session = await self._call(sessions.create_session, self.store, params.get("cwd"))
        await self._open(session.session_id, 0)
        return {"sessionId": session.session_id}

    async def _openable(self, params: dict[str, Any]) -> sessions.Session:
        sid = _session_id(params)
        _mcp_servers(params, required=False)
        session: sessions.Session = await self._call(sessions.get_session, self.store, sid)
        if session.archived:
            raise RpcError(
                -32004,
                "Session is archived; call session/unarchive first.",
                {"sessionId": sid, "archived": True},
            )
        return session

    async def load_session(self, params: dict[str, Any]) -> dict[str, Any]:
        """Replay the conversation as updates, then answer; live updates continue from the
        end of the replay, none lost in between and none sent twice (events arriving during
        the replay are held, then handled against the history cursor)."""
        session = await self._openable(params)
        sid = session.session_id
        if sid in self._loading:
            raise RpcError(INVALID_REQUEST, "session/load of this session is already running.")
        held: list[dict[str, Any]] = []
        self._loading[sid] = held
        try:
            self._close(sid)  # loading an open session replays it from the start
            await self._open(sid, 0)
            raw = await self._call(self.store.redis.lrange, self.store.keys.history(sid), 0, -1)
            self._cursor[sid] = len(raw)
            await self._send_history(sid, raw)
            while held:  # the forwarder keeps holding this session's events meanwhile
                await self._handle_event(held.pop(0), loading=True)
        finally:
            del self._loading[sid]
        return {}

    async def resume_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session = await self._openable(params)
        await self._open(session.session_id)
        return {}

    async def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = _session_id(params)
        await self._call(sessions.get_session, self.store, sid)
        cancelled = await self._cancel_turns(sid)
        self._close(sid)
        await self._call(audit.record, self.store, sid, "close", "closed", cancelledTurns=cancelled)
        return {}

    async def delete_session(self, params: dict[str, Any]) -> dict[str, Any]:
        # Like session/close, then freed: the session's work (its subtree's) is stopped as
        # session/archive stops it, and the session is deleted once that work has ended; work
        # that outlives the wait answers -32003 with the live items (nothing is hidden).
        sid = _session_id(params)
        await self._call(deletion.delete, self.store, self.dispatcher, sid, stop_activity=True)
        self._close(sid)
        return {}

    async def list_sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd, cursor = params.get("cwd"), params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise RpcError(INVALID_PARAMS, "cursor must be a string from nextCursor.")
        page = await self._call(
            sessions.list_sessions,
            self.store,
            archived=params.get("archived"),
            cwd=cwd,
            cursor=cursor,
            limit=LIST_PAGE,
        )
        result: dict[str, Any] = {"sessions": [s.to_info() for s in page.sessions]}
        if page.next_cursor:
            result["nextCursor"] = page.next_cursor
        return result

    async def archive_session(self, params: dict[str, Any]) -> dict[str, Any]:
        # On ACP the protocol's rule wins: an active session has its work stopped (as if
        # session/close were called) and is archived; never refused for being busy.
        sid = _session_id(params)
        await self._call(archive.archive, self.store, self.dispatcher, sid, stop_activity=True)
        return {}

    async def unarchive_session(self, params: dict[str, Any]) -> dict[str, Any]:
        await self._call(archive.unarchive, self.store, _session_id(params))
        return {}

    async def set_title(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = _session_id(params)
        # A missing title is the same mistake as a null one: -32602 "Title must not be empty."
        stored = await self._call(titles.set_title, self.store, sid, params.get("title"))
        return {"title": stored}

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = _session_id(params)
        text = _prompt_text(params)
        session: sessions.Session = await self._call(sessions.get_session, self.store, sid)
        if session.archived:
            raise SessionArchived(sid)
        await self._open(sid)  # before the turn exists: its updates are all sent
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        self._prompting[sid] = self._prompting.get(sid, 0) + 1
        try:
            tid: str = await self._call(turns.start_turn, self.store, self.dispatcher, sid, text)
        except BaseException:
            self._prompt_done(sid)
            raise
        self._prompt_turns.setdefault(sid, set()).add(tid)
        if tid in self._ended:
            future.set_result(self._ended.pop(tid))
        else:
            self._prompts[tid] = future
        try:
            while True:
                # The event normally settles the future; the poll covers a lost event.
                done, _ = await asyncio.wait({future}, timeout=2.0)
                if done:
                    break
                turn = await self._call(turns.get_turn, self.store, tid)
                if turn is not None and turn.state not in turns.LIVE_STATES:
                    # Its event was lost (or the session was closed here): let the forwarder
                    # send the turn's updates and settle the prompt, as the event would have.
                    self.events.put_nowait(
                        {
                            "type": "turn",
                            "sessionId": sid,
                            "turnId": tid,
                            "state": turn.state.value,
                            "stopReason": turns.STOP_REASON[turn.state],
                        }
                    )
        finally:
            self._prompts.pop(tid, None)
            mine = self._prompt_turns.get(sid, set())
            mine.discard(tid)
            if not mine:
                self._prompt_turns.pop(sid, None)
            self._prompt_done(sid)
        return {"stopReason": future.result()}

    def _prompt_done(self, sid: str) -> None:
        left = self._prompting.get(sid, 1) - 1
        if left > 0:
            self._prompting[sid] = left
            return
        self._prompting.pop(sid, None)
        if sid not in self.open:  # closed while the prompt ran: stop watching now
            self.hub.unwatch(sid, self.events)

    async def cancel(self, params: dict[str, Any]) -> None:
        # ACP session/cancel: the client cancels its prompt turn in flight on this session,
        # never a turn another client (or a later prompt of its own) started since.
        sid = _session_id(params)
        await self._cancel_turns(sid, sorted(self._prompt_turns.get(sid, ())))

    async def cancel_request(self, params: dict[str, Any]) -> None:
        """``$/cancel_request``: a pending session/prompt is cancelled like session/cancel and
        answers ``stopReason: cancelled``; any other pending request answers -32800."""
        entry = self._requests.get(_id_key(params.get("requestId")))
        if entry is None:
            return  # unknown or already answered
        task, method, msg = entry
        if method == "session/prompt":
            sid = _params(msg).get("sessionId")
            if isinstance(sid, str) and sid:
                await self._cancel_turns(sid, sorted(self._prompt_turns.get(sid, ())))
                return
        self._cancelled.add(_id_key(params.get("requestId")))
        task.cancel()

    async def _cancel_turns(self, sid: str, turn_ids: list[str] | None = None) -> int:
        """Cancel the named turns of the session (without ``turn_ids``, its live turns);
        return how many were asked to stop. A turn that
        ends ``cancelled`` at once (queued, or between steps) publishes no ``turn`` event, so
        its prompt is settled from here (through the forwarder, after the turn's updates); one
        with a step in flight is settled by the event its step publishes."""
        if turn_ids == []:
            return 0
        outcomes = await self._call(
            turns.cancel_session_turns, self.store, self.dispatcher, sid, turn_ids
        )
        for tid, outcome in outcomes.items():
            if outcome == "cancelled":
                self.events.put_nowait(
                    {
                        "type": "turn",
                        "sessionId": sid,
                        "turnId": tid,
                        "state": "cancelled",
                        "stopReason": "cancelled",
                    }
                )
        return sum(1 for outcome in outcomes.values() if outcome in ("cancelled", "cancelling"))

    async def activity(self, params: dict[str, Any]) -> dict[str, Any]:
        items = await self._call(activity.census, self.store, _session_id(params))
        return {"activity": [i.to_wire() for i in items]}


def _good_id(msg_id: Any) -> bool:
    """JSON-RPC ids are strings, integers or null (ACP RequestId); anything else is echoed
    as null, since it cannot identify a request."""
    return msg_id is None or (isinstance(msg_id, (str, int)) and not isinstance(msg_id, bool))


def _id_key(msg_id: Any) -> tuple[str, Any]:
    """A request id as a dictionary key (``1`` and ``"1"`` are different ids)."""
    return (type(msg_id).__name__, msg_id if isinstance(msg_id, (str, int)) else None)


def _mcp_servers(params: dict[str, Any], *, required: bool = True) -> None:
    servers = params.get("mcpServers", [] if not required else None)
    if servers is None and not required:
        return
    if not isinstance(servers, list):
        raise InvalidParams(
            "mcpServers must be an array (it may be empty).", {"param": "mcpServers"}
        )


Handler = Callable[[AcpConnection, dict[str, Any]], Awaitable[Any]]

_METHODS: dict[str, Handler] = {
    "initialize": AcpConnection.initialize,
    "session/new": AcpConnection.new_session,
    "session/load": AcpConnection.load_session,
    "session/resume": AcpConnection.resume_session,
    "session/close": AcpConnection.close_session,
    "session/delete": AcpConnection.delete_session,
    "session/list": AcpConnection.list_sessions,
    "session/archive": AcpConnection.archive_session,
    "session/unarchive": AcpConnection.unarchive_session,
    "session/set_title": AcpConnection.set_title,
    "session/prompt": AcpConnection.prompt,
    "_agentFleet/activity": AcpConnection.activity,
}
_NOTIFICATIONS: dict[str, Handler] = {
    "session/cancel": AcpConnection.cancel,
    "$/cancel_request": AcpConnection.cancel_request,
}
