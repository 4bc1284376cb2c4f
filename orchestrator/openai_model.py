"""``openai``: any OpenAI-compatible Chat Completions server behind the model seam.

Built on the official ``openai`` SDK. One step is one streamed chat-completion request with
the conversation (``orchestrator/chat.py``) and the tools on offer (``orchestrator/
toolbox.py``); text deltas go to ``emit`` as they arrive, tool calls come back in the answer,
and the finish reason maps to ACP's stop reasons (``stop`` -> ``end_turn``, ``length`` ->
``max_tokens``, ``content_filter`` or a refusal -> ``refusal``; tool calls: another step).

A stop (``cancel``) shuts the request's socket down within ``_CLOSE_POLL`` s, so the server
sees the connection close. Before each request it sends, the step's ``may_send`` reads the
store, so no request (first or retry) starts once a stop has committed. A 429, a 5xx or a
connection error before any text was streamed is tried again, at most
``FLEET_OPENAI_MAX_RETRIES`` times, with exponential back-off (tenacity) that a stop cuts
short. Any other error status raises ``ModelError`` with the provider's message (the turn ends
``failed``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import openai
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.model import (
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

#: How often the closer looks at ``cancel`` while a request streams (seconds).
_CLOSE_POLL = 0.005
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


def _abort(stream: Any) -> None:
    """Shut the stream's socket down (a recv blocked in another thread returns at once),
    then close the response."""
    network = stream.response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        stream.close()


def _closer(stream: Any, cancel: threading.Event, done: threading.Event) -> None:
    while not done.wait(_CLOSE_POLL):
        if cancel.is_set():
            _abort(stream)
            return


class OpenAIModel:
    """The ``openai`` backend (see the module docstring). ``model`` is the default model
    name; a session may name its own (``StepRequest.model``)."""

    def __init__(
        self,
        *,
        base_url: str = "",
        api_key: str = "",
        model: str = "",
        max_retries: int = 4,
        timeout: float = 600.0,
    ) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY") or "unset"
        self.client = openai.OpenAI(
            base_url=base_url or None, api_key=key, max_retries=0, timeout=timeout
        )
        self.model = model
        self.max_retries = max_retries

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
        done = threading.Event()
        threading.Thread(target=_closer, args=(stream, cancel, done), daemon=True).start()
        reader = _Reader(emit)
        try:
            for chunk in stream:
                reader.add(chunk)
        except openai.APIError as exc:
            if cancel.is_set():
                raise _Cancelled from exc
            if reader.emitted or not isinstance(exc, openai.APIConnectionError):
                raise ModelError(f"the model's answer broke off: {exc}") from exc
            raise _Retryable(f"the model server's answer broke off: {exc}") from exc
        finally:
            done.set()
            stream.close()
        if cancel.is_set():
            raise _Cancelled
        return reader.answer()


class _Reader:
    """Folds streamed chunks into an answer."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.emitted = False
        self.calls: dict[int, list[str]] = {}  # index -> [name, arguments]
        self.finish: str | None = None
        self.refused = False
        self.usage = Usage()

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
        for choice in chunk.choices:
            delta = choice.delta
            text = delta.content or getattr(delta, "refusal", None) or ""
            self.refused = self.refused or bool(getattr(delta, "refusal", None))
            if text:
                self.emitted = True
                self.emit(text)
            for tc in delta.tool_calls or []:
                # Some servers send each call whole and leave its index out.
                index = tc.index if isinstance(tc.index, int) else len(self.calls)
                slot = self.calls.setdefault(index, ["", ""])
                if tc.function is not None:
                    slot[0] += tc.function.name or ""
                    slot[1] += tc.function.arguments or ""
            if choice.finish_reason:
                self.finish = choice.finish_reason

    def answer(self) -> StepAnswer:
        calls = tuple(ToolCall(name, args) for _, (name, args) in sorted(self.calls.items()))
        if calls:
            return StepAnswer(calls, None, self.usage)
        stop = StopReason.REFUSAL if self.refused else _FINISH.get(self.finish or "stop")
        return StepAnswer((), stop or StopReason.END_TURN, self.usage)
