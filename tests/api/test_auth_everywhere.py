"""With ``FLEET_API_TOKEN`` set, every route of the HTTP API refuses a request without the
token (401, the one error shape, ``WWW-Authenticate: Bearer``), and the ``/acp`` WebSocket is
closed with 4401 before it is accepted.

The routes are read from ``app.routes``, so a route added later is covered without editing
this file. Public on purpose: ``/health`` and ``/ready`` (probes carry no token), and the
documentation (``/openapi.json``, ``/docs``, its assets under ``/docs/assets/``,
``/docs/oauth2-redirect``, ``/redoc``): the schema describes the API and holds no fleet data;
and the fleet console page (``/console``, its assets under ``/console/static/``, and ``/``,
which redirects to it), which holds no data and calls the API with the token. Flower asks
for its own credentials; that is tested in ``tests/ops/test_flower.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import api.rest
from orchestrator.settings import FleetSettings

TOKEN = "test-token-auth-everywhere"
#: Routes answered without the token, on purpose (see the module docstring).
PUBLIC = {
    "/health",
    "/ready",
    "/openapi.json",
    "/docs",
    "/docs/assets",
    "/docs/oauth2-redirect",
    "/redoc",
    "/console",
    "/console/static",
    "/console/families.js",
    "/",
}
#: Sample values for path parameters: well-formed ids of nothing.
PATH_VALUES = {
    "session_id": "sess_000000000000000000000000",
    "turn_id": "turn_0",
    "request_id": "perm_0",
}
#: A plausible body per route, so a route cannot answer 422 before checking the token.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/sessions"): {"cwd": "/tmp/fleet-auth-test"},
    ("POST", "/sessions/{session_id}/prompt"): {"prompt": "hello"},
    ("POST", "/sessions/{session_id}/permissions/{request_id}"): {"outcome": "allow"},
    ("POST", "/sessions/{session_id}/archive"): {"stopActivity": False},
    ("POST", "/sessions/archive"): {"sessionIds": ["sess_000000000000000000000000"]},
    ("PUT", "/sessions/{session_id}/title"): {"title": "t"},
}
HEADER_VARIANTS = {
    "none": {},
    "empty": {"Authorization": ""},
    "wrong token": {"Authorization": "Bearer not-the-token"},
    "other scheme": {"Authorization": f"Basic {TOKEN}"},
    "token without scheme": {"Authorization": TOKEN},
    "prefix of the token": {"Authorization": f"Bearer {TOKEN[:-1]}"},
}


@pytest.fixture(scope="module")
def app() -> Any:
    return api.rest.create_app(FleetSettings(api_token=TOKEN))


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _leaves(routes: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(full path, route)`` of every route, included routers walked into (FastAPI >= 0.12x
    keeps an included router as one ``_IncludedRouter`` entry of ``app.routes``)."""
    out: list[tuple[str, Any]] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            sub = getattr(getattr(route, "include_context", None), "prefix", "") or ""
            out.extend(_leaves(list(inner.routes), prefix + sub))
        elif hasattr(route, "routes") and not hasattr(route, "path"):
            out.extend(_leaves(list(route.routes), prefix))
        else:
            out.append((prefix + route.path, route))
    return out


def _http_routes(app: Any) -> list[tuple[str, str]]:
    out = []
    for path, route in _leaves(list(app.routes)):
        if isinstance(route, APIRoute):
            for method in sorted((route.methods or set()) - {"HEAD", "OPTIONS"}):
                out.append((method, path))
    return out


def _url(path: str) -> str:
    return path.format(**PATH_VALUES)


def _assert_401(resp: httpx.Response, what: str) -> None:
    assert resp.status_code == 401, f"{what}: {resp.status_code} {resp.text}"
    body = resp.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == "unauthorized", body
    assert body["error"]["message"], body
    assert isinstance(body["error"]["data"], dict), body
    assert resp.headers.get("www-authenticate") == "Bearer", resp.headers


def test_every_route_is_known(app: Any) -> None:
    """Every route is an API route, the websocket or a public documentation page: nothing
    mounted some other way escapes the checks below."""
    paths = set()
    for path, route in _leaves(list(app.routes)):
        paths.add(path)
        if not isinstance(route, (APIRoute, APIWebSocketRoute)):
            assert path in PUBLIC, f"{path} is neither an API route nor public"
    assert "/acp" in paths
    guarded = {(m, p) for m, p in _http_routes(app) if p not in PUBLIC}
    # Cross-check with the OpenAPI document: every documented operation is walked here.
    documented = {
        (method.upper(), path)
        for path, item in app.openapi()["paths"].items()
        for method in item
        if path not in PUBLIC
    }
    assert documented <= guarded, documented - guarded
    assert len(guarded) >= 15, guarded


def test_the_console_page_and_assets_are_public(client: TestClient) -> None:
    """The console holds no data: its page and assets answer without the token."""
    page = client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("app.js", "app.css"):
        assert client.get(f"/console/static/{asset}").status_code == 200, asset
    assert client.get("/sessions").status_code == 401


def test_every_guarded_route_refuses_without_the_token(app: Any, client: TestClient) -> None:
    checked = 0
    for method, path in _http_routes(app):
        if path in PUBLIC:
            continue
        body = BODIES.get((method, path))
        for name, headers in HEADER_VARIANTS.items():
            resp = client.request(method, _url(path), headers=headers, json=body)
            _assert_401(resp, f"{method} {path} with {name}")
            checked += 1
        if body is not None:  # no body at all: still 401, never 422 first
            resp = client.request(method, _url(path))
            _assert_401(resp, f"{method} {path} without a body")
            checked += 1
    print(f"auth: {checked} unauthenticated requests refused with 401")


def test_the_token_opens_the_routes(app: Any, client: TestClient) -> None:
    """Sanity: the same requests with the token are not refused for want of it (``/events``
    streams forever and is left out)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for method, path in _http_routes(app):
        if path in PUBLIC or path == "/events":
            continue
        resp = client.request(method, _url(path), headers=auth, json=BODIES.get((method, path)))
        assert resp.status_code != 401, f"{method} {path}: {resp.text}"
        assert resp.status_code < 500, f"{method} {path}: {resp.status_code} {resp.text}"
    # The scheme is case-insensitive (RFC 7235).
    resp = client.get("/sessions", headers={"Authorization": f"bearer {TOKEN}"})
    assert resp.status_code == 200, resp.text


def test_public_routes_answer_without_the_token(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/ready").status_code in (200, 503)
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize(
    "url,headers",
    [
        ("/acp", {}),
        ("/acp", {"Authorization": "Bearer wrong"}),
        ("/acp?token=wrong", {}),
        ("/acp?token=", {}),
        ("/acp", {"Authorization": f"Basic {TOKEN}"}),
    ],
)
def test_acp_websocket_refused_without_the_token(
    client: TestClient, url: str, headers: dict[str, str]
) -> None:
    with pytest.raises(WebSocketDisconnect) as info, client.websocket_connect(url, headers=headers):
        pass
    assert info.value.code == 4401
    assert info.value.reason


@pytest.mark.parametrize("how", ["header", "query"])
def test_acp_websocket_accepts_the_token(client: TestClient, how: str) -> None:
    url = f"/acp?token={TOKEN}" if how == "query" else "/acp"
    headers = {"Authorization": f"Bearer {TOKEN}"} if how == "header" else {}
    with client.websocket_connect(url, headers=headers) as ws:
        ws.send_text(
            '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
        )
        answer = ws.receive_json()
    assert answer["id"] == 1 and answer["result"]["protocolVersion"] == 1, answer
