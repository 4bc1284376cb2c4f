"""Hostile JSON on every surface: nothing a client sends gives a 500, a -32603 or a dead
connection. The shapes (``hostile_fragments`` of ``test_acp_fuzz``): integers of thousands of
digits (past CPython's int-from-string limit), non-finite numbers, nesting past the parse limit
and past the recursion limit, lone surrogates; sent in REST bodies, in listing cursors, in
JSON-RPC params and ids, to the in-process app, to a real ``fleet acp`` process and to the
``/acp`` WebSocket of a real ``fleet api`` process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

import api.rest
from orchestrator.settings import FleetSettings
from orchestrator.untrusted import MAX_DEPTH
from tests.api.test_acp_stdio import stdio_agent
from tests.api_process import api_process
from tests.fuzz.test_acp_fuzz import HOLE, hostile_cursor, hostile_fragments
from tests.helpers import RecordingDispatcher, error_shape

pytestmark = pytest.mark.redis

DEEP_CURSOR = hostile_cursor("[" * 3000 + "]" * 3000, whole=True)
HUGE = "1" * 5000
INIT = '{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1}}'
#: (method, path) of the routes that take a JSON body, with a body to put a fragment in.
BODY_ROUTES = [
    ("POST", "/sessions", {"cwd": HOLE}),
    ("POST", "/sessions/sess_000000000000000000000000/prompt", {"prompt": HOLE}),
    ("POST", "/sessions/sess_000000000000000000000000/archive", {"stopActivity": HOLE}),
    ("POST", "/sessions/archive", {"sessionIds": [HOLE]}),
    ("PUT", "/sessions/sess_000000000000000000000000/title", {"title": HOLE}),
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEET_API_TOKEN", raising=False)
        app = api.rest.create_app(FleetSettings(), dispatcher=RecordingDispatcher())
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


def test_a_cursor_of_3000_nested_brackets_is_refused_clearly(client: TestClient) -> None:
    # Given a cursor that decodes to 3,000 nested brackets
    # When it is sent to the REST listing and to ACP session/list
    # Then REST answers 400 input_rejected and ACP -32602, both naming the depth limit
    error = error_shape(
        client.get("/sessions", params={"cursor": DEEP_CURSOR}), 400, "input_rejected"
    )
    assert error["data"]["limit"] == "depth" and error["data"]["param"] == "cursor", error
    assert str(MAX_DEPTH) in error["message"] and "without a cursor" in error["message"], error
    with client.websocket_connect("/acp") as ws:
        ws.send_text(INIT)
        assert "result" in json.loads(ws.receive_text())
        ws.send_text(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "session/list",
                    "params": {"cursor": DEEP_CURSOR},
                }
            )
        )
        answer = json.loads(ws.receive_text())
    assert answer["id"] == 1 and answer["error"]["code"] == -32602, answer
    assert answer["error"]["data"]["limit"] == "depth", answer


def test_rest_bodies_and_cursors_survive_hostile_json(client: TestClient) -> None:
    seen: dict[str, int] = {}

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fragment=hostile_fragments, route=st.sampled_from(BODY_ROUTES + [None]))
    def run(fragment: str, route: tuple[str, str, dict[str, Any]] | None) -> None:
        if route is None:
            resp = client.get("/sessions", params={"cursor": hostile_cursor(fragment, False)})
            label = "GET /sessions?cursor"
        else:
            method, path, body = route
            text = json.dumps(body).replace(f'"{HOLE}"', fragment)
            resp = client.request(
                method,
                path,
                content=text.encode("utf-8", "surrogatepass"),
                headers={"Content-Type": "application/json"},
            )
            label = f"{method} {path}"
        seen[label] = seen.get(label, 0) + 1
        assert resp.status_code in (400, 413, 422), (label, resp.status_code, resp.text[:300])
        code = resp.json()["error"]["code"]
        error_shape(resp, resp.status_code, code)
        if route is not None and resp.status_code == 400:
            assert code in ("input_rejected", "invalid_json"), resp.text[:300]

    run()
    print(f"\nhostile REST inputs: {seen}")
    assert len(seen) == len(BODY_ROUTES) + 1, seen


def test_a_5000_digit_integer_leaves_fleet_acp_serving() -> None:
    # Given a real `fleet acp` process
    with stdio_agent("hostile") as agent:
        # When a request carries an integer of 5,000 digits in its params, in its id, and a
        # message nests 3,000 levels deep
        agent.send_raw(
            '{"jsonrpc":"2.0","id":41,"method":"initialize","params":{"protocolVersion":'
            + HUGE
            + "}}"
        )
        _, answer = agent.response(41)
        mark = agent.mark()
        agent.send_raw('{"jsonrpc":"2.0","id":' + HUGE + ',"method":"initialize"}')
        _, by_id = agent.wait(lambda m: "error" in m, since=mark)
        mark = agent.mark()
        agent.send_raw("[" * 3000 + "]" * 3000)
        _, deep = agent.wait(lambda m: "error" in m, since=mark)
        # Then each is answered with an error naming the limit and the process goes on
        assert answer["error"]["code"] == -32602, answer
        assert answer["error"]["data"]["path"] == "$.params.protocolVersion", answer
        assert by_id["id"] is None and by_id["error"]["code"] == -32600, by_id
        assert deep["id"] is None and deep["error"]["code"] == -32700, deep
        assert agent.alive(), agent.stderr()
        assert agent.call("initialize", {"protocolVersion": 1})["protocolVersion"] == 1
        agent.check_clean()


def test_a_5000_digit_integer_leaves_the_acp_websocket_open(tmp_path: Path) -> None:
    # Given a real `fleet api` process and a WebSocket on /acp
    with (
        api_process(tmp_path / "api.log") as server,
        connect(f"ws://127.0.0.1:{server.port}/acp", open_timeout=10) as ws,
    ):
        ws.send(INIT)
        assert "result" in json.loads(ws.recv(timeout=10))
        # When a request carries an integer of 5,000 digits, and then a lone surrogate
        ws.send(
            '{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":'
            + HUGE
            + "}}"
        )
        big = json.loads(ws.recv(timeout=10))
        ws.send(
            '{"jsonrpc":"2.0","id":8,"method":"session/new","params":{"cwd":"/tmp/\\ud800","mcpServers":[]}}'
        )
        surrogate = json.loads(ws.recv(timeout=10))
        # Then both are answered -32602 with their ids, and the socket still serves
        ws.send('{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":1}}')
        init = json.loads(ws.recv(timeout=10))
    assert big["id"] == 7 and big["error"]["code"] == -32602, big
    assert big["error"]["data"]["limit"] == "number", big
    assert surrogate["id"] == 8 and surrogate["error"]["code"] == -32602, surrogate
    assert init["id"] == 9 and init["result"]["protocolVersion"] == 1, init
    assert "Traceback" not in server.log(), server.log()[-2000:]
