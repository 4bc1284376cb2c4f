"""The JSON-RPC 2.0 layer of the ACP agent: framing, ids, dispatch, cancellation, errors.

``RpcEndpoint`` reads one message's text at a time (``handle_text``; ``handle_bytes`` for
bytes, which must be UTF-8), answers malformed messages, and runs each request or
notification as a task through a method table (``Method``: the params model and the
handler). Every error an answer carries is built by ``error_of``, one path: the JSON-RPC
protocol's own errors (``RpcError``), then the domain errors through the one table of
``api/errors.py`` (``SessionNotFound`` -32002, ``InvalidParams`` -32602, ...), then -32603
for a bug. ``$/cancel_request`` of a pending request answers it -32800, unless the endpoint
settles it otherwise (``cancel_request``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

from api.acp.params import parse
from api.errors import TRANSLATED, lookup, translate
from orchestrator import untrusted
from orchestrator.errors import DuplicateKey, InputRejected, InvalidParams

log = logging.getLogger(__name__)

#: Largest JSON-RPC message accepted, in bytes of text.
MAX_MESSAGE = 1_000_000


def _utf8_length_over(text: str, limit: int) -> bool:
    """Whether ``text`` takes more than ``limit`` bytes in UTF-8 (``MAX_MESSAGE`` counts bytes
    on every transport: a WebSocket text frame arrives decoded)."""
    if len(text) > limit:
        return True
    return len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit


PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
REQUEST_CANCELLED = -32800

Send = Callable[[dict[str, Any]], Awaitable[None]]
#: A request id as a dictionary key: (type name, value); ``1`` and ``"1"`` differ.
IdKey = tuple[str, Any]


class Method(NamedTuple):
    """One entry of a method table: the ACP schema model its params are validated with and
    the handler, called as ``handler(endpoint, params)``; its return value is the result."""

    params: type[BaseModel]
    handler: Callable[[Any, Any], Awaitable[Any]]


class RpcError(Exception):
    """A JSON-RPC protocol error (parse, invalid request, method not found, cancelled);
    domain errors are ``FleetError`` subclasses, mapped by ``api/errors.py``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


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


def error_of(exc: BaseException) -> dict[str, Any]:
    """The JSON-RPC error object (``{"code", "message", "data"?}``) answering ``exc``."""
    if isinstance(exc, UnicodeError):
        # A string with a lone surrogate (a "\ud800" escape) reached the store: the
        # client's mistake, not ours.
        exc = InvalidParams("Invalid params: strings must be valid Unicode (no lone surrogates).")
    if isinstance(exc, RpcError):
        code, message, data = exc.code, exc.message, exc.data
    elif isinstance(exc, TRANSLATED):
        error = translate(exc)
        code, message, data = lookup(error)[1], error.message, error.data or None
    else:
        code, message, data = INTERNAL_ERROR, "Internal error; see the agent's log.", None
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return body


def good_id(msg_id: Any) -> bool:
    """JSON-RPC ids are strings, integers or null (ACP RequestId); anything else is echoed
    as null, since it cannot identify a request."""
    return msg_id is None or (isinstance(msg_id, (str, int)) and not isinstance(msg_id, bool))


def id_key(msg_id: Any) -> IdKey:
    """A request id as a dictionary key (``1`` and ``"1"`` are different ids)."""
    return (type(msg_id).__name__, msg_id if isinstance(msg_id, (str, int)) else None)


class _BadRequest(RpcError):
    """-32600 for a message that is not a request, answered to ``msg_id`` (or null)."""

    def __init__(self, msg_id: Any, message: str) -> None:
        super().__init__(INVALID_REQUEST, f"Invalid request: {message}")
        self.msg_id = msg_id if good_id(msg_id) else None


def _request(msg: Any) -> tuple[Any, str]:
    """(id, method) of a JSON-RPC request or notification; raises ``_BadRequest`` for
    anything else. A response (to a request we never send) returns method ``""``."""
    msg_id = msg.get("id") if isinstance(msg, dict) else None
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise _BadRequest(msg_id, "expected a JSON-RPC 2.0 object.")
    if "method" not in msg:
        if "result" in msg or "error" in msg:
            return msg_id, ""
        raise _BadRequest(msg_id, "a request needs a method.")
    method = msg.get("method")
    if not isinstance(method, str) or not good_id(msg_id):
        raise _BadRequest(msg_id, "method must be a string and id a string, an integer or null.")
    return msg_id, method


def _not_a_request(method: str, notifications: dict[str, Method]) -> RpcError:
    """The error answering a request for ``method``, which has no request: -32600 when it is
    a notification (sent with an id by mistake; acp.md: ``session/cancel`` is one), else
    -32601."""
    if method in notifications:
        return RpcError(
            INVALID_REQUEST,
            f"Invalid request: {method} is a notification, which gets no answer; "
            "send it without an id.",
            {"method": method},
        )
    return RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


def _rejected(exc: InputRejected | DuplicateKey) -> tuple[Any, RpcError]:
    """(id, error) for a message over a parse limit or with a key given twice in an object:
    -32602 with its id when the problem is inside its params, -32600 when it is in the rest of
    it (a repeated ``id`` answers to null: which one was meant is unknown), -32700 when it
    could not be parsed at all (nested deeper than the parser goes). A repeated key is not a
    parse error: the text is JSON (RFC 8259 only says names SHOULD be unique) and was read;
    what it asks is ambiguous, which is what -32600 and -32602 say of a request."""
    msg = exc.partial
    if not isinstance(msg, dict):
        return None, RpcError(PARSE_ERROR, f"Parse error: {exc.message}", exc.data)
    id_repeated = isinstance(exc, DuplicateKey) and exc.data.get("path") == "$.id"
    msg_id = msg.get("id") if good_id(msg.get("id")) and not id_repeated else None
    in_params = str(exc.data.get("path", "")).startswith(("$.params.", "$.params["))
    if in_params and msg_id is not None and "method" in msg:
        return msg_id, RpcError(INVALID_PARAMS, f"Invalid params: {exc.message}", exc.data)
    return msg_id, RpcError(INVALID_REQUEST, f"Invalid request: {exc.message}", exc.data)


def _not_initialized(method: str, handshake: str) -> RpcError:
    """-32600 for a request sent before the connection's handshake succeeded: the request
    is not valid in that state (ACP: the client sends ``initialize`` first; the protocol
    has no code of its own for this, and -32002 is taken by "resource not found")."""
    return RpcError(
        INVALID_REQUEST,
        f"Invalid request: {method} before {handshake}; send {handshake} first and wait "
        "for its answer.",
        {"method": method, "expected": handshake},
    )


class RpcEndpoint:
    """One JSON-RPC peer: answers requests through ``methods``, runs ``notifications``.
    Subclasses provide the tables and may override ``started`` (first valid message) and
    ``cancel_request``. With ``handshake`` set (a method name), every other request is
    answered -32600 and every notification ignored until a ``handshake`` request has been
    answered with a result."""

    methods: dict[str, Method] = {}
    notifications: dict[str, Method] = {}
    handshake: str | None = None

    def __init__(self, send: Send) -> None:
        self._send_raw = send
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        # Requests being handled, by id (for $/cancel_request); ids cancelled that way.
        self.requests: dict[IdKey, tuple[asyncio.Task[None], str, dict[str, Any]]] = {}
        self._cancelled: set[IdKey] = set()
        # Why requests still pending are being cancelled by ``drain`` (``None`` until then).
        self._closing: str | None = None
        # Whether the handshake succeeded (always, for an endpoint without one).
        self.initialized = self.handshake is None
        # Requests this endpoint sent to the client, by id, waiting for their answers.
        self.outgoing: dict[IdKey, asyncio.Future[Any]] = {}
        self._next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        """Send one message (serialized: frames and lines never interleave)."""
        async with self._send_lock:
            await self._send_raw(message)

    async def answer_error(self, msg_id: Any, exc: BaseException) -> None:
        """Send the error response for ``exc`` (``error_of``) to request ``msg_id``."""
        await self.send({"jsonrpc": "2.0", "id": msg_id, "error": error_of(exc)})

    async def refuse_oversized(self) -> None:
        """Answer a message longer than ``MAX_MESSAGE`` that the transport did not read."""
        too_long = f"Invalid request: message larger than {MAX_MESSAGE} bytes."
        await self.answer_error(None, RpcError(INVALID_REQUEST, too_long))

    async def handle_bytes(self, data: bytes) -> None:
        """Handle one incoming message received as bytes (a stdio line, a binary frame): it
        must be UTF-8, else it is answered -32700 saying which byte is not. Bytes are never
        replaced with U+FFFD, which would change a string's value without a word."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            why = untrusted.not_utf8(data, exc)
            message = f"Parse error: message is not valid UTF-8 JSON: {why}."
            await self.answer_error(None, RpcError(PARSE_ERROR, message))
            return
        await self.handle_text(text)

    async def handle_text(self, text: str) -> None:
        """Handle one incoming JSON-RPC message. Never raises: a malformed message gets an
        error response and the connection goes on. JSON is read by ``orchestrator.untrusted``
        (depth, number and Unicode limits)."""
        try:
            await self._handle_text(text)
        except Exception as exc:  # a bug of ours must not end the client's connection
            log.exception("ACP message not handled")
            await self.answer_error(None, exc)

    async def _handle_text(self, text: str) -> None:
        if _utf8_length_over(text, MAX_MESSAGE):
            await self.refuse_oversized()
            return
        try:
            msg = untrusted.loads(text, param="message")
            msg_id, method = _request(msg)
        except json.JSONDecodeError as exc:
            error = RpcError(PARSE_ERROR, f"Parse error: not valid JSON ({exc.msg}).")
            await self.answer_error(None, error)
            return
        except (InputRejected, DuplicateKey) as exc:
            await self.answer_error(*_rejected(exc))
            return
        except _BadRequest as exc:
            await self.answer_error(exc.msg_id, exc)
            return
        if not method:
            self._answered(msg_id, msg)
            return
        await self.started()
        is_request = "id" in msg
        task = asyncio.create_task(self._dispatch(method, msg, is_request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if is_request:
            key = id_key(msg_id)
            self.requests[key] = (task, method, msg)
            task.add_done_callback(lambda t: self._forget_request(key, t))

    async def started(self) -> None:
        """Called before the first valid message of the connection is dispatched."""

    async def request(self, method: str, params: dict[str, Any]) -> tuple[Any, Any]:
        """Send a request to the client and wait for its answer: ``(result, error)``, one of
        them ``None``. Cancelling the wait sends ``$/cancel_request`` for it."""
        self._next_id += 1
        msg_id = f"fleet-{self._next_id}"
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.outgoing[id_key(msg_id)] = answer
        try:
            await self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
            msg = await answer
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.send(
                    {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": msg_id}}
                )
            raise
        finally:
            self.outgoing.pop(id_key(msg_id), None)
        return msg.get("result"), msg.get("error")

    def _answered(self, msg_id: Any, msg: dict[str, Any]) -> None:
        """A response from the client: settle the request of ours it answers (others are
        ignored)."""
        if not good_id(msg_id):
            return
        waiting = self.outgoing.get(id_key(msg_id))
        if waiting is not None and not waiting.done():
            waiting.set_result(msg)

    def _forget_request(self, key: IdKey, task: asyncio.Task[None]) -> None:
        if self.requests.get(key, (None,))[0] is task:
            del self.requests[key]

    async def _dispatch(self, method: str, msg: dict[str, Any], is_request: bool) -> None:
        msg_id = msg.get("id")
        entry = (self.methods if is_request else self.notifications).get(method)
        try:
            if entry is None:
                if is_request:
                    raise _not_a_request(method, self.notifications)
                return
            if not self.initialized and method != self.handshake:
                if is_request:
                    raise _not_initialized(method, str(self.handshake))
                return  # a notification gets no answer, error or not
            result = await entry.handler(self, parse(entry.params, msg.get("params")))
            # Set before the answer is sent: a request dispatched after this one (tasks run
            # in the order received) is served even if its client did not wait.
            self.initialized = self.initialized or method == self.handshake
            if is_request:
                await self.send({"jsonrpc": "2.0", "id": msg_id, "result": result})
        except asyncio.CancelledError:
            key = id_key(msg_id)
            if not is_request or key not in self._cancelled:
                raise  # the connection is closing
            self._cancelled.discard(key)
            message = "Request cancelled." + (f" {self._closing}" if self._closing else "")
            await self.answer_error(msg_id, RpcError(REQUEST_CANCELLED, message))
        except Exception as exc:
            if not isinstance(exc, (RpcError, UnicodeError, *TRANSLATED)):
                log.exception("ACP %s failed", method)
            if is_request:
                await self.answer_error(msg_id, exc)

    async def cancel_request(self, request_id: Any) -> None:
        """``$/cancel_request``: a pending request is cancelled and answers -32800."""
        key = id_key(request_id)
        entry = self.requests.get(key)
        if entry is None:
            return  # unknown or already answered
        self._cancelled.add(key)
        entry[0].cancel()

    async def drain(self, timeout: float) -> None:
        """The client sent its last message (stdin closed): wait up to ``timeout`` seconds for
        the requests already received to be answered (a store failure answers -32010 within
        the store's retry bound), then answer each one still pending -32800 saying so, so no
        request goes unanswered. Notifications still running are left to ``cancel_tasks``."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        pending = [entry[0] for entry in self.requests.values() if not entry[0].done()]
        if not pending:
            return
        self._closing = f"The client closed its input and no answer came within {timeout:g} s."
        for key, entry in list(self.requests.items()):
            if not entry[0].done():
                self._cancelled.add(key)
                entry[0].cancel()
        await asyncio.wait(pending, timeout=1)

    def cancel_tasks(self) -> None:
        """Cancel every request and notification still being handled (the transport closed)."""
        for task in list(self._tasks):
            task.cancel()
