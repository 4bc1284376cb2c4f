"""ACP starts with ``initialize``: until it has been answered, every other request of the
connection is answered -32600 (invalid request: naming the method and the handshake) and
does nothing, and notifications are ignored; after it, the same requests are served. On both
transports, each a real process: ``fleet acp`` (stdio) and the ``/acp`` WebSocket of
``fleet api``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.api.test_acp_stdio import INVALID_REQUEST, TIMEOUT, StdioAgent
from tests.api_process import api_process
from tests.helpers import STARTUP_TIMEOUT

pytestmark = pytest.mark.redis

Ask = Callable[[dict[str, Any]], dict[str, Any]]


def _before_and_after(ask: Ask, notify: Callable[[dict[str, Any]], None]) -> None:
    """Given a fresh connection (``ask`` sends a request and returns its answer), check what
    is answered before ``initialize`` and after it."""
    cwd = f"/tmp/fleet-acp-init/{uuid.uuid4().hex}"
    before = [
        ("session/new", {"cwd": cwd, "mcpServers": []}),
        ("session/list", {}),
        ("session/archive", {"sessionId": "sess_000000000000000000000000"}),
        ("session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}),
    ]
    # When requests come before initialize (and a notification, which gets no answer)
    notify({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}})
    for rid, (method, params) in enumerate(before, 1):
        answer = ask({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        # Then each is answered -32600 with its id, naming itself and initialize
        assert answer["id"] == rid and "result" not in answer, answer
        error = answer["error"]
        assert error["code"] == INVALID_REQUEST, answer
        assert error["data"] == {"method": method, "expected": "initialize"}, answer
        assert "initialize first" in error["message"], answer
    # When the client initializes
    init = ask(
        {"jsonrpc": "2.0", "id": 10, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    assert init["result"]["protocolVersion"] == 1, init
    # Then the same requests are served, and the session/new sent before created nothing
    listed = ask({"jsonrpc": "2.0", "id": 11, "method": "session/list", "params": {"cwd": cwd}})
    assert listed["result"]["sessions"] == [], listed
    made = ask({"jsonrpc": "2.0", "id": 12, "method": "session/new", "params": before[0][1]})
    assert made["result"]["sessionId"], made


def test_stdio_serves_nothing_before_initialize() -> None:
    agent = StdioAgent("before-init")
    try:

        def ask(message: dict[str, Any]) -> dict[str, Any]:
            agent.send(message)
            # (the bound of the process's start: the first answer waits for it)
            return agent.response(message["id"], STARTUP_TIMEOUT)[1]

        _before_and_after(ask, agent.send)
        agent.check_clean()
    finally:
        agent.close()


def test_the_websocket_serves_nothing_before_initialize(tmp_path: Path) -> None:
    with (
        api_process(tmp_path / "api.log") as api,
        connect(f"ws://127.0.0.1:{api.port}/acp", open_timeout=10) as ws,
    ):

        def ask(message: dict[str, Any]) -> dict[str, Any]:
            ws.send(json.dumps(message))
            answer: dict[str, Any] = json.loads(ws.recv(timeout=TIMEOUT))
            return answer

        _before_and_after(ask, lambda message: ws.send(json.dumps(message)))
