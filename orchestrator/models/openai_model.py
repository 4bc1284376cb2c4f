"""``openai``: any OpenAI-compatible Chat Completions server behind the model seam.

Built on the official ``openai`` SDK. One step is one streamed chat-completion request with
the conversation (``orchestrator/models/chat.py``) and the tools on offer (``orchestrator/
toolbox.py``); text deltas go to ``emit`` as they arrive, tool calls come back in the answer,
and the finish reason maps to ACP's stop reasons (``stop`` -> ``end_turn``, ``length`` ->
``max_tokens``, ``content_filter`` or a refusal -> ``refusal``; tool calls: another step).

A stop (``cancel``) shuts the request's socket down at once, at any point of the request:
connecting, waiting for the response's headers or reading its stream, so the server sees the
connection close and the step's thread is free. The client's network backend (``_Backend``)
hands every socket it opens for a request to that request's ``_Abort`` before connecting it;
the step's ``Cancel`` (``orchestrator/models/model.py``) calls ``_Abort.fire`` when it is set. Each
request has its own connection (no keep-alive pool). Only a name lookup (``getaddrinfo``)
cannot be cut short: a stop during one ends the request when it returns. Before each request
it sends, the step's ``may_send`` reads the store: no request starts once a stop committed.

The answer is untrusted input: a stream the SDK cannot decode (``data: {not json``, a chunk
nested too deep) or whose chunks are not of the shapes Chat Completions sends ends the step
with ``ModelError`` naming what was wrong (one request, never retried); a tool call whose name
and arguments pass ``max_call_bytes`` (``model.TOOL_CALL_MAX_BYTES``), or more tool calls
than ``max_calls`` (``model.MAX_TOOL_CALLS``), stop the request there (the runtime answers the
over-long call with a tool error, ``orchestrator/turn/toolbox.py``; too many calls fail the turn).

A 429, a 5xx or a connection error before any text was streamed is tried again (at most
``FLEET_OPENAI_MAX_RETRIES`` times, exponential back-off a stop cuts short); any other error
status raises ``ModelError`` with the provider's message (the turn ends ``failed``).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import httpcore2
import httpx2
import openai

# The stream httpcore2's sync backend returns (the package exports no name for it).
from httpcore2._backends.sync import SyncStream
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.models.model import (
    MAX_TOOL_CALLS,
    TOOL_CALL_MAX_BYTES,
    Cancel,
    Emit,
    Message,
    ModelError,
    Role,
    StepAnswer,
    StepRequest,
    StopReason,
    ToolCall,
    ToolSpec,
    Usage,
)

#: Seconds a request may wait for the server's next bytes before it counts as failed.
TIMEOUT_SECONDS = 600.0

_FINISH = {
    "stop": StopReason.END_TURN,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}


class _Retryable(Exception):
    """A 429, a 5xx or a connection error: the request may be tried again."""


class _Cancelled(Exception):
    """The step was stopped before or while the request ran."""


def messages(conversation: Sequence[Message]) -> list[dict[str, Any]]:
    """Chat Completions ``messages`` for a conversation."""
    out: list[dict[str, Any]] = []
    for m in conversation:
        if m.role is Role.USER:
            out.append({"role": "user", "content": m.text})
        elif m.role is Role.TOOL:
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.text})
        elif m.tool_calls:
            calls = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": m.text or None, "tool_calls": calls})
        else:
            out.append({"role": "assistant", "content": m.text})
    return out


def tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Chat Completions ``tools`` for the tools on offer."""
    return [
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.parameters},
        }
        for s in specs
    ]


class _Abort:
    """The sockets one request opened; ``fire`` shuts them down (a ``connect``, a ``recv``
    blocked in another thread returns at once) and refuses any opened after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.fired = False

    def adopt(self, sock: socket.socket) -> None:
        """Keep a duplicate of ``sock``'s descriptor: shutting it down reaches the connection
        whatever later wraps the original (TLS takes its descriptor over). Raises
        ``OSError`` (``ECANCELED``) once fired."""
        with self._lock:
            if self.fired:
                raise OSError(errno.ECANCELED, "the step was stopped")
            self._socks.append(sock.dup())

    def fire(self) -> None:
        """Shut every socket of the request down (idempotent; quick: a ``Cancel`` hook)."""
        with self._lock:  # under the lock: ``close`` cannot free a descriptor meanwhile
            self.fired = True
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Release the duplicates (the request is over)."""
        with self._lock:
            self.fired = True
            for sock in self._socks:
                sock.close()
            self._socks.clear()


#: The request the calling thread is sending (the pool connects in the requesting thread).
_current: contextvars.ContextVar[_Abort | None] = contextvars.ContextVar(
    "openai_request", default=None
)


class _Backend(httpcore2.SyncBackend):
    """httpcore2's synchronous backend, with each socket handed to the current request's
    ``_Abort`` before it connects (``socket.create_connection``, unrolled for that)."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        abort = _current.get()
        if abort is None:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            sock = _connect(abort, host, port, timeout, local_address)
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(exc) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(exc) from exc
        return SyncStream(sock)


def _connect(
    abort: _Abort, host: str, port: int, timeout: float | None, local_address: str | None
) -> socket.socket:
    """A socket connected to ``host``:``port`` (each address in turn), adopted by ``abort``
    before it connects. Raises ``OSError``."""
    failed: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            abort.adopt(sock)
            sock.settimeout(timeout)
            if local_address is not None:
                sock.bind((local_address, 0))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            if abort.fired:
                raise
            failed = exc
    raise failed or OSError(f"no address for {host}")


def _http_client(timeout: float) -> httpx2.Client:
    """The SDK's default HTTP client without keep-alive, every transport of it (proxies from
    the environment included) connecting through ``_Backend``."""
    client = openai.DefaultHttpxClient(
        timeout=timeout, limits=httpx2.Limits(max_keepalive_connections=0)
    )
    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        if pool is not None:  # httpcore2's pools take their backend at construction only
            pool._network_backend = _Backend()
    return client


@contextlib.contextmanager
def _abortable(cancel: threading.Event) -> Iterator[_Abort]:
    """The calling thread's requests, until the block ends, are shut down once ``cancel`` is
    set: at once through a ``Cancel`` hook, else within ``_POLL`` s (a plain ``Event``)."""
    abort = _Abort()
    token = _current.set(abort)
    try:
        if isinstance(cancel, Cancel):
            with cancel.on_set(abort.fire):
                yield abort
        else:
            done = threading.Event()
            threading.Thread(target=_poll, args=(cancel, abort, done), daemon=True).start()
            try:
                yield abort
            finally:
                done.set()
    finally:
        _current.reset(token)
        abort.close()


#: How often a request watches a plain ``Event`` (not a ``Cancel``) for a stop (seconds).
_POLL = 0.005


def _poll(cancel: threading.Event, abort: _Abort, done: threading.Event) -> None:
    while not done.wait(_POLL):
        if cancel.is_set():
            abort.fire()
            return


class OpenAIModel:
    """The ``openai`` backend (see the module docstring) on the server at ``base_url`` with
    ``api_key`` (empty: the SDK's ``OPENAI_BASE_URL``, else api.openai.com, and
    ``OPENAI_API_KEY``). ``model`` is the default model name; a session may name its own
    (``StepRequest.model``). ``max_call_bytes`` bounds what is read of one tool call's name
    and arguments (UTF-8 bytes), ``max_calls`` the tool calls of one answer."""

    def __init__(
        self,
        *,
        base_url: str = "",
        api_key: str = "",
        model: str = "",
        max_retries: int = 4,
        timeout: float = TIMEOUT_SECONDS,
        max_call_bytes: int = TOOL_CALL_MAX_BYTES,
        max_calls: int = MAX_TOOL_CALLS,
    ) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY") or "unset"
        self.client = openai.OpenAI(
            base_url=base_url or None,
            api_key=key,
            max_retries=0,
            timeout=timeout,
            http_client=_http_client(timeout),
        )
        self.model = model
        self.max_retries = max_retries
        self.max_call_bytes = max_call_bytes
        self.max_calls = max_calls

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        """One streamed request (tried again on 429/5xx/connection errors). Returns a
        ``cancelled`` answer once ``cancel`` is set. Raises ``ModelError``."""
        name = request.model or self.model
        if not name:
            raise ModelError("no model named: set FLEET_OPENAI_MODEL or name one for the session")
        body: dict[str, Any] = {
            "model": name,
            "messages": messages(request.conversation),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = tools(request.tools)
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential(multiplier=0.2, max=5),
            sleep=lambda seconds: None if cancel.wait(seconds) else None,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    if not request.may_send():
                        raise _Cancelled
                    return self._request(body, cancel, emit)
        except _Cancelled:
            return StepAnswer(stop=StopReason.CANCELLED)
        except _Retryable as exc:
            raise ModelError(f"{exc} (tried {self.max_retries + 1} times)") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(self, body: dict[str, Any], cancel: threading.Event, emit: Emit) -> StepAnswer:
        if cancel.is_set():
            raise _Cancelled
        with _abortable(cancel):
            return self._send(body, cancel, emit)

    def _send(self, body: dict[str, Any], cancel: threading.Event, emit: Emit) -> StepAnswer:
        try:
            stream = self.client.chat.completions.create(**body)
        except (openai.RateLimitError, openai.InternalServerError) as exc:
            raise _Retryable(f"the model server answered {exc.status_code}: {exc.message}") from exc
        except openai.APIStatusError as exc:
            raise ModelError(f"the model server answered {exc.status_code}: {exc.message}") from exc
        except openai.APIConnectionError as exc:
            if cancel.is_set():
                raise _Cancelled from exc
            raise _Retryable(f"the model server could not be reached: {exc}") from exc
        reader = _Reader(emit, self.max_call_bytes, self.max_calls)
        try:
            for chunk in stream:
                if reader.add(chunk):
                    break  # a tool call passed its bound: its step answers a tool error
        except openai.APIError as exc:
            if cancel.is_set():
                raise _Cancelled from exc
            if reader.emitted or not isinstance(exc, openai.APIConnectionError):
                raise ModelError(f"the model's answer broke off: {exc}") from exc
            raise _Retryable(f"the model server's answer broke off: {exc}") from exc
        except ModelError:
            raise
        except Exception as exc:
            # Untrusted input: what the SDK could not decode (JSONDecodeError, RecursionError)
            # or chunks of shapes Chat Completions never sends. The same request would
            # answer the same: the step ends here, once.
            if cancel.is_set():
                raise _Cancelled from exc
            raise ModelError(
                f"the model server sent a malformed answer ({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
        finally:
            stream.close()
        if cancel.is_set():
            raise _Cancelled
        return reader.answer()


def _string(value: Any, what: str) -> str:
    """``value`` when it is a string (``None``: ``""``); raises ``TypeError`` naming ``what``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}, not a string")
    return value


class _Reader:
    """Folds streamed chunks into an answer, keeping at most ``max_bytes`` (+1 character) of
    each tool call's name and arguments and at most ``max_calls`` calls."""

    def __init__(self, emit: Emit, max_bytes: int, max_calls: int) -> None:
        self.emit = emit
        self.max_bytes = max_bytes
        self.max_calls = max_calls
        self.emitted = False
        self.calls: dict[int, list[str]] = {}  # index -> [name, arguments]
        self.sizes: dict[int, int] = {}  # index -> UTF-8 bytes of name and arguments so far
        self.finish: str | None = None
        self.refused = False
        self.usage = Usage()

    def add(self, chunk: Any) -> bool:
        """Fold ``chunk`` in. Returns whether a tool call passed ``max_bytes`` (read no
        more). Raises ``ModelError`` past ``max_calls`` calls, ``TypeError`` (or another
        error of a malformed chunk) for a field of the wrong type."""
        if chunk.usage is not None:  # checked by usage.record, which drops what is no count
            used = chunk.usage
            prompt = getattr(used, "prompt_tokens", None)
            completion = getattr(used, "completion_tokens", None)
            self.usage = Usage(
                0 if prompt is None else prompt, 0 if completion is None else completion
            )
        for choice in chunk.choices or ():
            delta = choice.delta
            refusal = _string(getattr(delta, "refusal", None), "refusal")
            text = _string(delta.content, "content") or refusal
            self.refused = self.refused or bool(refusal)
            if text:
                self.emitted = True
                self.emit(text)
            for tc in delta.tool_calls or ():
                if self._add_call(tc):
                    return True
            if choice.finish_reason is not None:
                self.finish = _string(choice.finish_reason, "finish_reason")
        return False

    def _add_call(self, tc: Any) -> bool:
        # Some servers send each call whole and leave its index out.
        index = tc.index if type(tc.index) is int else len(self.calls)
        slot = self.calls.get(index)
        if slot is None:
            if len(self.calls) >= self.max_calls:
                raise ModelError(
                    f"the model answered more than {self.max_calls} tool calls in one step"
                )
            slot = self.calls[index] = ["", ""]
            self.sizes[index] = 0
        if tc.function is None:
            return False
        name = _string(tc.function.name, "a tool call's name")
        arguments = _string(tc.function.arguments, "a tool call's arguments")
        slot[0] += name
        slot[1] += arguments
        self.sizes[index] += _utf8_len(name) + _utf8_len(arguments)
        if self.sizes[index] <= self.max_bytes:
            return False
        # Over the bound: keep one character more than it allows (so toolbox.parse_call
        # finds the call too long), and stop reading.
        keep = self.max_bytes + 1
        slot[0] = slot[0][:keep]
        slot[1] = slot[1][: keep - len(slot[0])]
        return True

    def answer(self) -> StepAnswer:
        calls = tuple(ToolCall(name, args) for _, (name, args) in sorted(self.calls.items()))
        if calls:
            return StepAnswer(calls, None, self.usage)
        stop = StopReason.REFUSAL if self.refused else _FINISH.get(self.finish or "stop")
        return StepAnswer((), stop or StopReason.END_TURN, self.usage)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
