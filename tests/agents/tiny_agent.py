"""A small ACP agent for the fleet's fast tests, run over stdio:
``python tests/agents/tiny_agent.py``.

It keeps its sessions as JSON files under ``$HOME/tiny-sessions`` (so ``session/load``
works across processes, replaying the conversation) and answers each prompt by its first
line:

==========================  ================================================================
``run: CMD``                asks permission (a tool call of kind ``execute``), runs ``sh -c
                            CMD`` in a session of its own (as real agents start their shells),
                            reports the tool call, then says ``done: <first line of output>``
                            (``denied`` when the permission is not granted)
``write: PATH TEXT``        ``fs/write_text_file`` through the client, says ``wrote``
``read: PATH``              ``fs/read_text_file`` through the client, says ``read: <text>``
``flood: N``                N message chunks of ``x``
``count: N``                N message chunks ``0 ``, ``1 ``, ... in order
``big: N``                  one message chunk of N bytes
``garbage``                 writes a line that is not JSON-RPC, then answers
``exit: N``                 ends its own process with status N mid-prompt
``deaf: SECONDS``           ignores ``session/cancel`` and sleeps SECONDS
``history``                 says how many earlier prompts its session holds
``pid``                     says its process id
anything else               says ``echo: <prompt>``
==========================  ================================================================

A ``session/cancel`` ends the running prompt with ``cancelled`` but, like Codex, leaves a
command it started running: the fleet has to kill it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, run_agent, start_tool_call, text_block, update_agent_message
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
)

ROOT = Path(os.environ.get("HOME", "/tmp")) / "tiny-sessions"


class Tiny:
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **_: Any) -> InitializeResponse:
        return InitializeResponse(
            protocolVersion=PROTOCOL_VERSION,
            agentCapabilities=AgentCapabilities(loadSession=True),
        )

    async def new_session(self, cwd: str, **_: Any) -> NewSessionResponse:
        sid = uuid.uuid4().hex
        self._save(sid, {"cwd": cwd, "prompts": []})
        return NewSessionResponse(sessionId=sid)

    async def load_session(self, cwd: str, session_id: str, **_: Any) -> LoadSessionResponse:
        data = self._load(session_id)
        for text in data["prompts"]:
            await self._say(session_id, f"(replayed) {text}")
        return LoadSessionResponse()

    async def cancel(self, session_id: str, **_: Any) -> None:
        self.cancelled.setdefault(session_id, asyncio.Event()).set()

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> PromptResponse:
        text = "".join(getattr(block, "text", "") for block in prompt)
        data = self._load(session_id)
        earlier = len(data["prompts"])
        data["prompts"].append(text)
        self._save(session_id, data)
        stop = asyncio.Event()
        self.cancelled[session_id] = stop
        line = text.splitlines()[-1] if text else ""
        work = asyncio.ensure_future(self._answer(session_id, line, data["cwd"], earlier))
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            waiter.cancel()
            return PromptResponse(stopReason=work.result())
        if line.startswith("deaf:"):
            return PromptResponse(stopReason=await work)
        work.cancel()
        return PromptResponse(stopReason="cancelled")

    async def _answer(self, sid: str, line: str, cwd: str, earlier: int) -> str:
        word, _, rest = line.partition(":")
        rest = rest.strip()
        if word == "run":
            return await self._run(sid, rest)
        if word == "write":
            path, _, body = rest.partition(" ")
            try:
                await self.conn.write_text_file(session_id=sid, path=path, content=body)
                await self._say(sid, "wrote")
            except Exception as exc:
                await self._say(sid, f"refused: {exc}")
        elif word == "read":
            try:
                got = await self.conn.read_text_file(session_id=sid, path=rest)
                await self._say(sid, f"read: {got.content}")
            except Exception as exc:
                await self._say(sid, f"refused: {exc}")
        elif word == "flood":
            for _ in range(int(rest)):
                await self._say(sid, "x")
        elif word == "count":
            for i in range(int(rest)):
                await self._say(sid, f"{i} ")
        elif word == "big":
            await self._say(sid, "y" * int(rest))
        elif line == "garbage":
            sys.stdout.buffer.write(b"{this is not json-rpc\n")
            sys.stdout.buffer.flush()
            await self._say(sid, "after garbage")
        elif word == "exit":
            os._exit(int(rest))
        elif word == "deaf":
            await asyncio.sleep(float(rest))
            await self._say(sid, "woke")
        elif line == "pid":
            await self._say(sid, f"pid: {os.getpid()}")
        elif line == "history":
            await self._say(sid, f"history: {earlier}")
        else:
            await self._say(sid, f"echo: {line}")
        return "end_turn"

    async def _run(self, sid: str, command: str) -> str:
        call = uuid.uuid4().hex[:8]
        await self.conn.session_update(
            session_id=sid,
            update=start_tool_call(call, command, kind="execute", status="pending"),
        )
        options = [
            PermissionOption(optionId="yes", name="Allow", kind="allow_once"),
            PermissionOption(optionId="no", name="Reject", kind="reject_once"),
        ]
        answer = await self.conn.request_permission(
            session_id=sid,
            tool_call=ToolCallUpdate(toolCallId=call, title=command, kind="execute"),
            options=options,
        )
        outcome = answer.outcome
        if getattr(outcome, "option_id", None) != "yes":
            await self._tool(sid, call, "failed", "denied")
            await self._say(sid, "denied")
            return "end_turn"
        await self._tool(sid, call, "in_progress", "")
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", command, stdout=subprocess.PIPE, start_new_session=True
        )
        out, _ = await proc.communicate()
        first = out.decode("utf-8", "replace").splitlines()[:1]
        await self._tool(sid, call, "completed", out.decode("utf-8", "replace"))
        await self._say(sid, f"done: {first[0] if first else ''}")
        return "end_turn"

    async def _tool(self, sid: str, call: str, status: str, text: str) -> None:
        from acp.schema import ToolCallProgress

        await self.conn.session_update(
            session_id=sid,
            update=ToolCallProgress(
                sessionUpdate="tool_call_update",
                toolCallId=call,
                status=status,
                content=[{"type": "content", "content": text_block(text)}] if text else None,
            ),
        )

    async def _say(self, sid: str, text: str) -> None:
        await self.conn.session_update(
            session_id=sid, update=update_agent_message(text_block(text))
        )

    def _save(self, sid: str, data: dict[str, Any]) -> None:
        ROOT.mkdir(parents=True, exist_ok=True)
        (ROOT / f"{sid}.json").write_text(json.dumps(data))

    def _load(self, sid: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((ROOT / f"{sid}.json").read_text())
        return loaded


if __name__ == "__main__":
    asyncio.run(run_agent(Tiny()))
