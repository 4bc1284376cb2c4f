"""The fleet as an agent's ACP client: what an agent may ask of the fleet while it runs a
prompt, each request passing the gate first.

- ``session/update``: handed to the ``Sink`` (the turn's conversation): message text as it
  streams, tool calls, plans and thoughts as updates of the turn; updates a ``session/load``
  replays are dropped (the fleet's record already holds them).
- ``session/request_permission``: answered by the definition's policy (``allow``: the first
  allowing option; ``deny``: the first rejecting one) or, under ``ask``, by a person through
  the ``Sink`` within the definition's timeout; ``cancelled`` when no answer comes, when no
  option fits, and always once the session's lineage is archived. (A JSON-RPC error would
  wedge some agents' sessions: Codex's next prompt never returns.)
- ``fs/read_text_file``, ``fs/write_text_file``: confined to the session's ``cwd``
  (``confined``): a path outside it, or a symbolic link leading out of it, is refused.
- ``terminal/*`` is not offered (the agents run their shells themselves, inside the agent's
  contained tree); a request for it is refused as an unknown method.

Each refusal is a JSON-RPC error with a message naming why (``acp.RequestError``), and each
request is recorded by the sink.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from acp import RequestError
from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ToolCallUpdate,
    WriteTextFileResponse,
)

from orchestrator.agents.definitions import AgentDefinition, Policy

#: Largest update the conversation keeps whole, in bytes of JSON; a larger one is cut.
MAX_UPDATE_BYTES = 256 * 1024
#: Largest file the fleet reads or writes for an agent, in bytes.
MAX_FILE_BYTES = 8 * 1024 * 1024
#: Most updates one prompt may send; past it the agent is stopped and the turn fails.
MAX_UPDATES = 50_000


class AgentFailed(Exception):
    """The agent broke the turn (exited, sent what cannot be read, flooded, timed out); the
    turn ends ``failed`` with this message."""


@dataclass(frozen=True)
class PermissionAsk:
    """A permission request for a person: ``request_id`` (the fleet's), the tool call it is
    about (``tool_call``: ACP ``ToolCallUpdate`` as JSON) and the agent's ``options`` (each
    ``{"optionId", "name", "kind"}``)."""

    request_id: str
    tool_call: dict[str, Any]
    options: list[dict[str, Any]]


class Sink(Protocol):
    """Where an agent's prompt lands: the fleet's side of the turn (``orchestrator/turn``)."""

    def text(self, text: str) -> None:
        """A piece of the agent's message."""

    def update(self, update: dict[str, Any]) -> bool:
        """Record a ``session/update`` of the turn (tool call, plan, thought). Returns
        whether it landed (``False``: the turn no longer runs)."""

    def admitted(self) -> bool:
        """Whether the turn still runs and its lineage is not archived (the gate)."""

    def ask(self, ask: PermissionAsk, timeout: float) -> str | None:
        """Wait up to ``timeout`` s for a person to pick one of ``ask.options``; the chosen
        option id, or ``None`` (no answer, or the turn stopped)."""


def confined(cwd: str, path: str) -> Path:
    """``path`` (absolute) resolved, when it lies inside ``cwd`` once every symbolic link is
    followed. Raises ``RequestError`` (invalid params) naming the path otherwise."""
    if not os.path.isabs(path):
        raise RequestError.invalid_params({"path": path, "reason": "the path must be absolute"})
    root = Path(os.path.realpath(cwd))
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise RequestError.invalid_params(
            {"path": path, "reason": f"outside the session's working directory {str(root)!r}"}
        )
    return real


def _pick(options: list[PermissionOption], kinds: tuple[str, ...]) -> str | None:
    for kind in kinds:
        for option in options:
            if option.kind == kind:
                return option.option_id
    return None


def _answer(option_id: str | None) -> RequestPermissionResponse:
    if option_id is None:
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
    chosen = AllowedOutcome.model_validate({"outcome": "selected", "optionId": option_id})
    return RequestPermissionResponse(outcome=chosen)


class FleetClient:
    """The ACP ``Client`` the fleet is to one agent process running one prompt in ``cwd``,
    under ``defn``'s policy, landing what it says in ``sink``. ``replaying`` is set while a
    ``session/load`` replays the agent's history (those updates are dropped); ``failure``
    says why the prompt must fail (an update over a bound), once one did."""

    def __init__(self, defn: AgentDefinition, cwd: str, sink: Sink, new_id: Any) -> None:
        self.defn, self.cwd, self.sink = defn, cwd, sink
        self.replaying = False
        self.updates = 0
        self._order = asyncio.Lock()
        #: Set with ``failure`` (``fail``), for waits that must end at once.
        self.failed = asyncio.Event()
        #: The task passing the agent's output on (``runner._pump``), while it runs.
        self.pump: Any = None
        #: Why the prompt must end failed (a bound passed), set by an update's handler.
        self.failure = ""
        self._new_id = new_id

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        if self.replaying or self.failure:
            return
        self.updates += 1
        if self.updates > MAX_UPDATES:
            self.fail(f"the agent sent more than {MAX_UPDATES} updates in one prompt")
            return
        # The connection handles notifications as concurrent tasks: the lock (first come, first
        # served) lands them in the order they arrived.
        async with self._order:
            try:
                await self._land(update)
            except AgentFailed as exc:  # the connection would only log it: the prompt reads it
                self.fail(str(exc))

    def fail(self, why: str) -> None:
        """The agent broke the protocol or a bound: its prompt ends failed with ``why``."""
        if not self.failure:
            self.failure = why
        self.failed.set()

    async def _land(self, update: Any) -> None:
        wire = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        kind = wire.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = wire.get("content", {})
            if content.get("type") == "text":
                await asyncio.to_thread(self.sink.text, str(content.get("text", "")))
            return
        if kind in ("tool_call", "tool_call_update", "plan", "agent_thought_chunk"):
            await asyncio.to_thread(self.sink.update, _bounded(wire))

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **_: Any
    ) -> RequestPermissionResponse:
        if not await asyncio.to_thread(self.sink.admitted):
            return _answer(None)
        policy = self.defn.permissions
        if policy is Policy.ALLOW:
            return _answer(_pick(options, ("allow_once", "allow_always")))
        if policy is Policy.DENY:
            return _answer(_pick(options, ("reject_once", "reject_always")))
        ask = PermissionAsk(
            self._new_id("perm"),
            tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
            [o.model_dump(mode="json", by_alias=True, exclude_none=True) for o in options],
        )
        chosen = await asyncio.to_thread(self.sink.ask, ask, self.defn.permission_timeout_seconds)
        known = {o.option_id for o in options}
        return _answer(chosen if chosen in known else None)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **_: Any,
    ) -> ReadTextFileResponse:
        await self._admit("fs/read_text_file")
        real = confined(self.cwd, path)
        try:
            if real.stat().st_size > MAX_FILE_BYTES:
                raise RequestError.invalid_params(
                    {"path": path, "reason": f"larger than {MAX_FILE_BYTES} bytes"}
                )
            text = real.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise RequestError.resource_not_found(path) from exc
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            end = start + limit if limit is not None else None
            text = "".join(lines[start:end])
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **_: Any
    ) -> WriteTextFileResponse | None:
        await self._admit("fs/write_text_file")
        if len(content.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
            raise RequestError.invalid_params(
                {"path": path, "reason": f"larger than {MAX_FILE_BYTES} bytes"}
            )
        real = confined(self.cwd, path)
        try:
            real.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise RequestError.invalid_params({"path": path, "reason": str(exc)}) from exc
        self.sink.update(
            {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": f"wrote {path}"},
            }
        )
        return WriteTextFileResponse()

    async def _admit(self, method: str) -> None:
        if not await asyncio.to_thread(self.sink.admitted):
            raise RequestError.invalid_request(
                {"method": method, "reason": "the session is archived or its turn stopped"}
            )

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


def _bounded(wire: dict[str, Any]) -> dict[str, Any]:
    """``wire`` as the conversation keeps it: whole when its JSON is at most
    ``MAX_UPDATE_BYTES``, else with its large parts (``content``, ``rawInput``,
    ``rawOutput``, ``entries``) replaced by a note."""
    import json

    if len(json.dumps(wire)) <= MAX_UPDATE_BYTES:
        return wire
    cut = dict(wire)
    for name in ("content", "rawInput", "rawOutput", "entries"):
        if name in cut:
            cut[name] = (
                None
                if name != "content"
                else [
                    {
                        "type": "content",
                        "content": {"type": "text", "text": "(cut: over the update size limit)"},
                    }
                ]
            )
    return cut
