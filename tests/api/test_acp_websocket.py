"""The ACP agent over the ``/acp`` WebSocket of the HTTP API (one JSON-RPC message per text
frame), in process through ``TestClient``, against the real test Redis. The same
``AcpConnection`` serves stdio; these tests check the transport and the cross-process
notifications (a change made through the REST API or by a ``fleet acp`` process reaches the
WebSocket client as ``session_info_update``).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import api.rest
from tests.api.test_acp_stdio import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NOT_FOUND,
    PARSE_ERROR,
    PROMPT_TIMEOUT,
    SESSION_CAPABILITIES,
    RpcPeer,
    StdioAgent,
    check_non_finite_refused,
    listed,
    new_session,
    stdio_agent,
    text_prompt,
)
from tests.helpers import rest_client


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # One TestClient context: one event loop for every socket of the module.
    with TestClient(api.rest.create_app()) as c:
        yield c


@contextlib.contextmanager
def acp_socket(client: TestClient, name: str) -> Iterator[RpcPeer]:
    """An RpcPeer on ``/acp``; a reader thread feeds it every frame received."""
    with client.websocket_connect("/acp") as ws:
        peer = RpcPeer(ws.send_text, name)

        def read() -> None:
            try:
                while True:
                    peer.feed(ws.receive_text())
            except Exception:  # the socket closed
                pass
            finally:
                peer.eof()

        reader = threading.Thread(target=read, name=f"{name}-ws", daemon=True)
        reader.start()
        peer.ws = ws  # type: ignore[attr-defined]
        init = peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert init["protocolVersion"] == 1
        yield peer
        assert not peer.ended, f"{name}: the socket closed under the test"
        peer.check_clean()


@pytest.fixture(scope="module")
def ws(client: TestClient) -> Iterator[RpcPeer]:
    with acp_socket(client, "ws") as peer:
        yield peer


@pytest.fixture(scope="module")
def other() -> Iterator[StdioAgent]:
    """A ``fleet acp`` process: another client in another process."""
    with stdio_agent("other") as agent:
        yield agent


@pytest.fixture
def cwd() -> str:
    return f"/tmp/fleet-acp-ws-test/{uuid.uuid4().hex}"


def test_ws_initialize_advertises_the_session_capabilities(ws: RpcPeer) -> None:
    result = ws.call("initialize", {"protocolVersion": 1})
    assert result["protocolVersion"] == 1
    caps = result["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["sessionCapabilities"] == {name: {} for name in SESSION_CAPABILITIES}


def test_ws_parse_error_keeps_the_socket_open(ws: RpcPeer) -> None:
    mark = ws.mark()
    ws.send_raw("{not json")
    _, msg = ws.wait(lambda m: (m.get("error") or {}).get("code") == PARSE_ERROR, since=mark)
    assert msg["id"] is None
    for text in ("[]", "42", '{"jsonrpc": "1.0", "id": 1, "method": "initialize"}'):
        mark = ws.mark()
        ws.send_raw(text)
        ws.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    ws.error("session/teleport", {}, METHOD_NOT_FOUND)
    assert ws.call("session/list", {"cwd": "/nonexistent/acp-ws"}) == {"sessions": []}


def test_ws_binary_frames_are_read_as_utf8_text(ws: RpcPeer) -> None:
    ws.ws.send_bytes(  # type: ignore[attr-defined]
        b'{"jsonrpc":"2.0","id":"bin","method":"session/list","params":{"cwd":"/n\xc3\xa4"}}'
    )
    assert ws.response("bin")[1]["result"] == {"sessions": []}
    mark = ws.mark()
    ws.ws.send_bytes(b"\xff\xfe")  # type: ignore[attr-defined]
    ws.wait(lambda m: (m.get("error") or {}).get("code") == PARSE_ERROR, since=mark)
    assert ws.call("session/list", {"cwd": "/nonexistent/acp-ws"}) == {"sessions": []}


def test_ws_binary_frame_not_utf8_is_a_parse_error_never_a_replaced_string(ws: RpcPeer) -> None:
    # A cut sequence inside a string: read with U+FFFD in its place, the request would run
    # on a value the client never sent.
    mark = ws.mark()
    ws.ws.send_bytes(  # type: ignore[attr-defined]
        b'{"jsonrpc":"2.0","id":"cut","method":"session/list","params":{"cwd":"/n\xc3"}}'
    )
    _, msg = ws.wait(lambda m: (m.get("error") or {}).get("code") == PARSE_ERROR, since=mark)
    assert msg["id"] is None, msg
    assert msg["error"]["message"] == (
        "Parse error: message is not valid UTF-8 JSON: "
        "byte 0xc3 at offset 71 is not UTF-8 (invalid continuation byte)."
    ), msg
    assert not any(m.get("id") == "cut" for m in ws.messages)
    assert ws.call("session/list", {"cwd": "/nonexistent/acp-ws"}) == {"sessions": []}


def test_ws_a_key_given_twice_is_refused_never_the_last_one_taken(ws: RpcPeer, cwd: str) -> None:
    sid = new_session(ws, cwd)
    # In params: -32602 answered to the request's id, naming the key and where; not archived.
    ws.send_raw(
        '{"jsonrpc":"2.0","id":"dup","method":"session/archive",'
        f'"params":{{"sessionId":"nope","sessionId":"{sid}"}}}}'
    )
    error = ws.response("dup")[1]["error"]
    assert error["code"] == INVALID_PARAMS, error
    assert "'sessionId' was given twice" in error["message"], error
    assert error["data"] == {"param": "sessionId", "path": "$.params.sessionId", "in": "message"}
    assert sid in listed(ws, cwd, "exclude")
    # In the envelope: -32600, to the id; a repeated id itself is answered to null.
    ws.send_raw('{"jsonrpc":"2.0","id":"env","method":"session/list","method":"session/new"}')
    assert ws.response("env")[1]["error"]["code"] == INVALID_REQUEST
    mark = ws.mark()
    ws.send_raw('{"jsonrpc":"2.0","id":"a","id":"b","method":"session/list","params":{}}')
    _, msg = ws.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    assert msg["id"] is None and "'id' was given twice" in msg["error"]["message"], msg
    assert not any(m.get("id") in ("a", "b") for m in ws.messages)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_ws_nan_and_infinity_are_refused_as_numbers_that_are_not_finite(
    ws: RpcPeer, cwd: str, literal: str
) -> None:
    check_non_finite_refused(ws, cwd, literal)
    assert ws.call("session/list", {"cwd": "/nonexistent/acp-ws"}) == {"sessions": []}


@pytest.mark.parametrize("value", [True, False, "yes", 1])
def test_ws_list_rejects_unsupported_archived_values_never_silently_excluding(
    ws: RpcPeer, value: Any
) -> None:
    ws.error("session/list", {"archived": value}, INVALID_PARAMS)


def test_ws_list_filters_and_cursor_errors(ws: RpcPeer, cwd: str) -> None:
    kept, hidden = new_session(ws, cwd), new_session(ws, cwd)
    ws.call("session/archive", {"sessionId": hidden})
    assert set(listed(ws, cwd)) == {kept}
    assert set(listed(ws, cwd, "include")) == {kept, hidden}
    assert set(listed(ws, cwd, "only")) == {hidden}
    ws.error("session/list", {"cwd": "relative"}, INVALID_PARAMS)
    ws.error("session/list", {"cursor": "garbled"}, INVALID_PARAMS)


def test_ws_archive_and_unarchive_are_idempotent_and_unknown_is_not_found(
    ws: RpcPeer, cwd: str
) -> None:
    sid = new_session(ws, cwd)
    for _ in range(2):
        assert ws.call("session/archive", {"sessionId": sid}) == {}
    assert listed(ws, cwd, "only")[sid]["archived"] is True
    for _ in range(2):
        assert ws.call("session/unarchive", {"sessionId": sid}) == {}
    assert listed(ws, cwd)[sid]["archived"] is False
    ws.error("session/archive", {"sessionId": "sess_" + "4" * 24}, NOT_FOUND)
    ws.error("session/unarchive", {"sessionId": "sess_" + "4" * 24}, NOT_FOUND)


def test_ws_set_title(ws: RpcPeer, cwd: str) -> None:
    sid = new_session(ws, cwd)
    assert ws.call("session/set_title", {"sessionId": sid, "title": "  a\n\tb  "}) == {
        "title": "a b"
    }
    assert listed(ws, cwd)[sid]["title"] == "a b"
    err = ws.error("session/set_title", {"sessionId": sid, "title": "   "}, INVALID_PARAMS)
    assert err["message"] == "Title must not be empty."
    ws.error("session/set_title", {"sessionId": sid}, INVALID_PARAMS)
    ws.error("session/set_title", {"sessionId": "sess_" + "5" * 24, "title": "x"}, NOT_FOUND)


def test_ws_prompt_ends_with_end_turn_after_its_updates(ws: RpcPeer, fleet: Any, cwd: str) -> None:
    sid = new_session(ws, cwd)
    rid = ws.request_async("session/prompt", text_prompt(sid, "say hello over ws"))
    at, msg = ws.response(rid, PROMPT_TIMEOUT)
    assert msg["result"] == {"stopReason": "end_turn"}
    chunks = ws.updates(sid, "agent_message_chunk")
    assert [u["content"]["text"] for _, u in chunks] == ["hello over ws"]
    assert all(i < at for i, _ in ws.updates(sid))


def test_ws_client_hears_archive_made_through_the_rest_api(
    ws: RpcPeer, client: TestClient, cwd: str
) -> None:
    sid = new_session(ws, cwd)
    resp = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
    assert resp.status_code == 200, resp.text
    ws.wait_update(sid, lambda u: u == {"sessionUpdate": "session_info_update", "archived": True})
    assert client.post(f"/sessions/{sid}/unarchive").status_code == 200
    ws.wait_update(sid, lambda u: u == {"sessionUpdate": "session_info_update", "archived": False})


def test_ws_client_hears_changes_made_by_a_fleet_acp_process(
    ws: RpcPeer, other: StdioAgent, cwd: str
) -> None:
    sid = new_session(ws, cwd)
    other.call("session/set_title", {"sessionId": sid, "title": "from\nanother process"})
    ws.wait_update(
        sid,
        lambda u: u == {"sessionUpdate": "session_info_update", "title": "from another process"},
    )
    other.call("session/archive", {"sessionId": sid})
    ws.wait_update(sid, lambda u: u.get("archived") is True)


def test_ws_archive_from_another_process_cancels_the_prompt_after_notifying(
    ws: RpcPeer, other: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(ws, cwd)
    rid = ws.request_async("session/prompt", text_prompt(sid, "think 30"))
    ws.wait_update(sid, lambda u: u["sessionUpdate"] == "user_message_chunk")
    other.call("session/archive", {"sessionId": sid})
    at, msg = ws.response(rid, 20)
    assert msg["result"] == {"stopReason": "cancelled"}
    info_at, _ = ws.wait_update(sid, lambda u: u.get("archived") is True)
    assert info_at < at


def test_ws_two_sockets_are_independent(client: TestClient, ws: RpcPeer, cwd: str) -> None:
    with acp_socket(client, "ws2") as ws2:
        sid = new_session(ws2, cwd)
        ws.call("session/set_title", {"sessionId": sid, "title": "seen by ws2"})
        ws2.wait_update(sid, lambda u: u.get("title") == "seen by ws2")
        assert ws.updates(sid) == []
    # ws2 closed; the first socket still works.
    assert ws.call("session/list", {"cwd": cwd}) is not None


@pytest.fixture
def api_token() -> str:
    return f"tok-{uuid.uuid4().hex}"


def test_ws_acp_requires_the_bearer_token_when_one_is_configured(api_token: str) -> None:
    from starlette.websockets import WebSocketDisconnect

    with rest_client(FLEET_API_TOKEN=api_token) as client:
        _token_checks(client, api_token, WebSocketDisconnect)


def _token_checks(client: TestClient, api_token: str, WebSocketDisconnect: Any) -> None:
    for kwargs in (
        {},
        {"headers": {"Authorization": "Bearer wrong"}},
        {"headers": {"Authorization": f"Basic {api_token}"}},
    ):
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            client.websocket_connect("/acp", **kwargs),  # type: ignore[arg-type]
        ):
            pass
        assert refused.value.code == 4401
    for path, kwargs in (
        ("/acp", {"headers": {"Authorization": f"Bearer {api_token}"}}),
        (f"/acp?token={api_token}", {}),
    ):
        with client.websocket_connect(path, **kwargs) as ws:  # type: ignore[arg-type]
            ws.send_text(
                '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
            )
            assert '"protocolVersion": 1' in ws.receive_text()
