"""The PyPI ACP client (``agent-client-protocol`` 0.12, ``import acp``) against ``fleet acp``.

The library covers the stable methods (initialize, session/new, session/prompt, session/cancel,
session/load, session/list) with typed models; it has no routes for archive, unarchive or
set_title, so those go through its raw JSON-RPC connection. Its models validate what the agent
sends, so every notification and response here also passes the library's schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

acp = pytest.importorskip("acp", reason="pip install agent-client-protocol (the test extra)")

from acp import RequestError, spawn_agent_process, text_block  # noqa: E402
from acp.schema import (  # noqa: E402
    AgentMessageChunk,
    ClientCapabilities,
    SessionInfoUpdate,
    UserMessageChunk,
)

T = TypeVar("T")
TIMEOUT = 45.0


class Recorder:
    """The client side: records every session/update, in arrival order."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("session/request_permission")

    def on_connect(self, conn: Any) -> None:
        pass

    def texts(self, session_id: str, kind: type = AgentMessageChunk) -> list[str]:
        found: list[Any] = [
            u for sid, u in self.updates if sid == session_id and isinstance(u, kind)
        ]
        return [u.content.text for u in found]


@contextlib.asynccontextmanager
async def connection() -> AsyncIterator[tuple[Any, Recorder]]:
    recorder = Recorder()
    client: Any = recorder  # implements the part of acp.Client that the agent calls
    async with spawn_agent_process(
        client,
        sys.executable,
        "-m",
        "api.cli",
        "acp",
        env=dict(os.environ),  # FLEET_REDIS_URL / FLEET_KEY_PREFIX of this run
        transport_kwargs={"stderr": None},
    ) as (conn, _process):
        init = await asyncio.wait_for(
            conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities()), TIMEOUT
        )
        assert init.protocol_version == 1
        yield conn, recorder


def run(test: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(test(), 120))


def _cwd() -> str:
    return f"/tmp/fleet-acp-py-test/{uuid.uuid4().hex}"


def test_python_client_initialize_reports_capabilities() -> None:
    async def body() -> None:
        async with connection() as (conn, _):
            init = await conn.initialize(protocol_version=1)
            caps = init.agent_capabilities
            assert caps.load_session is True
            sc = caps.session_capabilities
            for name in ("list", "close", "resume"):
                assert getattr(sc, name) is not None, name

    run(body)


def test_python_client_new_session_and_prompt_end_turn(fleet: Any) -> None:
    async def body() -> None:
        async with connection() as (conn, rec):
            cwd = _cwd()
            session = await conn.new_session(cwd=cwd, mcp_servers=[])
            sid = session.session_id
            reply = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("say hello from python")]), TIMEOUT
            )
            assert reply.stop_reason == "end_turn"
            # Every update of the turn was handled before the response returned.
            assert rec.texts(sid) == ["hello from python"]
            titles = [
                u.title for s, u in rec.updates if s == sid and isinstance(u, SessionInfoUpdate)
            ]
            assert titles == ["say hello from python"]  # the generated title
            listing = await conn.list_sessions(cwd=cwd)
            assert [s.session_id for s in listing.sessions] == [sid]
            assert listing.sessions[0].title == "say hello from python"
            assert listing.next_cursor is None

    run(body)


def test_python_client_cancel_resolves_the_prompt_cancelled(fleet: Any) -> None:
    async def body() -> None:
        async with connection() as (conn, rec):
            sid = (await conn.new_session(cwd=_cwd(), mcp_servers=[])).session_id
            pending = asyncio.create_task(
                conn.prompt(session_id=sid, prompt=[text_block("think 30")])
            )
            for _ in range(200):
                if rec.texts(sid, UserMessageChunk):
                    break
                await asyncio.sleep(0.05)
            await conn.cancel(session_id=sid)
            reply = await asyncio.wait_for(pending, 15)
            assert reply.stop_reason == "cancelled"

    run(body)


def test_python_client_load_session_replays_the_conversation(fleet: Any) -> None:
    async def body() -> None:
        cwd = _cwd()
        async with connection() as (conn, _):
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            reply = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("say first\nsay second")]), TIMEOUT
            )
            assert reply.stop_reason == "end_turn"
        async with connection() as (conn, rec):
            await asyncio.wait_for(conn.load_session(cwd=cwd, session_id=sid), TIMEOUT)
            # The replay came before the response, so it is all here now.
            assert rec.texts(sid, UserMessageChunk) == ["say first\nsay second"]
            assert rec.texts(sid) == ["first", "second"]

    run(body)


def test_python_client_raw_connection_for_archive_unarchive_and_set_title() -> None:
    async def body() -> None:
        async with connection() as (conn, rec):
            cwd = _cwd()
            sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
            raw = conn._conn  # the library's JSON-RPC connection (no typed routes for these)
            assert await raw.send_request(
                "session/set_title", {"sessionId": sid, "title": " T "}
            ) == {"title": "T"}
            assert await raw.send_request("session/archive", {"sessionId": sid}) == {}
            listing = await raw.send_request("session/list", {"cwd": cwd, "archived": "only"})
            assert [(s["sessionId"], s["archived"]) for s in listing["sessions"]] == [(sid, True)]
            with pytest.raises(RequestError) as refused:
                await conn.load_session(cwd=cwd, session_id=sid)
            assert "unarchive" in str(
                refused.value.args[0] if refused.value.args else refused.value
            )
            assert await raw.send_request("session/unarchive", {"sessionId": sid}) == {}
            await conn.load_session(cwd=cwd, session_id=sid)
            with pytest.raises(RequestError) as bad:
                await raw.send_request("session/list", {"archived": True})
            assert bad.value.code == -32602
            with pytest.raises(RequestError) as missing:
                await raw.send_request("session/archive", {"sessionId": "sess_" + "6" * 24})
            assert missing.value.code == -32002
            # The typed client parsed the title notification (it drops the unknown `archived`).
            for _ in range(100):
                if any(isinstance(u, SessionInfoUpdate) and u.title == "T" for _, u in rec.updates):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"no session_info_update title: {rec.updates}")

    run(body)
