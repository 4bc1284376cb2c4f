"""Cross-site requests and WebSocket hijacking: a browser page of another origin may neither
change state (POST, PUT, PATCH, DELETE on any route) nor open ``/acp``, token or not; the
API's own origin (the console), clients that send no ``Origin`` (CLI, SDKs) and origins listed
in ``FLEET_API_ALLOWED_ORIGINS`` may. The routes are read from ``app.routes``, so a route added
later is covered without editing this file. The same in a real browser:
``tests/console/test_origin_browser.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import api.rest
from api.guards import STATE_CHANGING
from orchestrator.settings import FleetSettings
from tests.api.test_auth_everywhere import BODIES, PUBLIC, _http_routes, _url
from tests.helpers import error_shape

pytestmark = pytest.mark.redis

EVIL = "http://127.0.0.1:9"  # another port of the same host is another origin
OWN = "http://testserver"  # TestClient's Host


@pytest.fixture(params=["no token", "token"])
def client(request: pytest.FixtureRequest) -> Iterator[TestClient]:
    settings = FleetSettings(
        api_token="origin-token" if request.param == "token" else "",
        api_allowed_origins="https://Fleet.Example.com, http://[::1]:8080",
    )
    with TestClient(api.rest.create_app(settings), raise_server_exceptions=False) as c:
        c.headers["Authorization"] = "Bearer origin-token"
        yield c


def test_every_state_changing_route_refuses_a_foreign_origin(client: TestClient) -> None:
    routes = [(m, p) for m, p in _http_routes(client.app) if m in STATE_CHANGING]
    assert len(routes) >= 8, routes
    for method, path in routes:
        for origin in (EVIL, "null", "http://testserver.evil.com", "https://testserver"):
            resp = client.request(
                method, _url(path), json=BODIES.get((method, path)), headers={"Origin": origin}
            )
            error = error_shape(resp, 403, "origin_forbidden")
            assert error["data"] == {"origin": origin}, (method, path, error)
            assert "FLEET_API_ALLOWED_ORIGINS" in error["message"], error


def test_own_origin_no_origin_and_listed_origins_may_change_state(client: TestClient) -> None:
    allowed = [None, OWN, "http://testserver:80", "https://fleet.example.com", "http://[::1]:8080"]
    for origin in allowed:
        headers = {} if origin is None else {"Origin": origin}
        resp = client.post("/sessions", json={"cwd": "/tmp/fleet-origin"}, headers=headers)
        assert resp.status_code == 201, (origin, resp.text)


def test_reads_are_left_to_the_browser(client: TestClient) -> None:
    for method, path in _http_routes(client.app):
        if method == "GET" and path not in PUBLIC and path != "/events":
            resp = client.get(_url(path), headers={"Origin": EVIL})
            assert resp.status_code != 403, (path, resp.text)


def test_acp_refuses_a_foreign_origin_with_1008(client: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect) as info,
        client.websocket_connect("/acp?token=origin-token", headers={"Origin": EVIL}) as ws,
    ):
        ws.send_text('{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}')
        ws.receive_text()  # the close, never an answer
    assert info.value.code == 1008 and "FLEET_API_ALLOWED_ORIGINS" in info.value.reason


@pytest.mark.parametrize("origin", [None, OWN, "https://fleet.example.com"])
def test_acp_serves_its_own_and_listed_origins(client: TestClient, origin: str | None) -> None:
    headers = {} if origin is None else {"Origin": origin}
    with client.websocket_connect("/acp?token=origin-token", headers=headers) as ws:
        ws.send_text(
            '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
        )
        assert ws.receive_json()["result"]["protocolVersion"] == 1


def test_a_listed_origin_gets_cors_answers(client: TestClient) -> None:
    """A page of a listed origin may also read answers and send JSON (preflight passes)."""
    resp = client.options(
        "/sessions",
        headers={
            "Origin": "https://fleet.example.com",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["access-control-allow-origin"] == "https://fleet.example.com"
