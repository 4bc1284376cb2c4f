"""DNS rebinding: a page whose DNS name is made to point at 127.0.0.1 is, to the browser, of its
own origin; its requests reach the API with that name in ``Host`` and in ``Origin``. With no
token (the loopback default) the API answers only to loopback names, ``FLEET_API_HOST`` and
the names of ``FLEET_API_ALLOWED_HOSTS``: every other ``Host`` is refused, HTTP with 403
``host_forbidden`` and ``/acp`` closed with 1008, whatever the route. With a token, every
name is served (the page has no token). A real ``fleet api`` process, real sockets; the same
from a real browser in ``tests/console/test_origin_browser.py``."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.api_process import ApiProcess, api_process
from tests.helpers import error_shape

pytestmark = pytest.mark.redis

REBOUND = "rebound.example"
INIT = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'


def _as(api: ApiProcess, name: str) -> dict[str, str]:
    """Headers of a page at ``http://name:<port>`` calling the API of that origin."""
    host = f"{name}:{api.port}"
    return {"Host": host, "Origin": f"http://{host}"}


def _session(api: ApiProcess) -> str:
    resp = httpx.post(f"{api.base}/sessions", json={"cwd": f"/tmp/fleet-host/{uuid.uuid4().hex}"})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["sessionId"])


def _acp_as(api: ApiProcess, name: str) -> tuple[list[str], int | None, str]:
    """Open ``/acp`` naming ``name`` in ``Host`` (the socket goes to 127.0.0.1, as a rebound
    name's does) and send ``initialize``: (messages received, close code, close reason)."""
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=10)
    seen: list[str] = []
    try:
        with connect(
            f"ws://{name}:{api.port}/acp",
            sock=sock,
            origin=f"http://{name}:{api.port}",  # type: ignore[arg-type]
            open_timeout=10,
        ) as ws:
            ws.send(INIT)
            seen.append(str(ws.recv(timeout=10)))
            return seen, None, ""
    except ConnectionClosed as exc:
        close = exc.rcvd
        return seen, close.code if close else None, close.reason if close else ""


def test_without_a_token_a_rebound_name_is_refused_on_every_surface(tmp_path: Path) -> None:
    # Given the API with no token and a session
    with api_process(tmp_path / "api.log") as api:
        sid = _session(api)
        headers = _as(api, REBOUND)
        # When a page of http://rebound.example:<port> lists, creates, archives, streams
        calls = [
            ("GET", "/sessions", None),
            ("GET", f"/sessions/{sid}", None),
            ("POST", "/sessions", {"cwd": "/tmp/fleet-host/evil"}),
            ("POST", f"/sessions/{sid}/archive", {"stopActivity": True}),
            ("POST", f"/sessions/{sid}/unarchive", None),
            ("GET", "/events", None),
            ("GET", "/health", None),
        ]
        for method, path, body in calls:
            resp = httpx.request(method, api.base + path, json=body, headers=headers, timeout=10)
            # Then each is refused 403 host_forbidden, saying how to allow the name
            error = error_shape(resp, 403, "host_forbidden")
            assert error["data"] == {"host": headers["Host"]}, (path, error)
            assert "FLEET_API_ALLOWED_HOSTS" in error["message"], error
        # And /acp is closed with 1008 before it answers anything
        seen, code, reason = _acp_as(api, REBOUND)
        assert (seen, code) == ([], 1008) and reason.startswith("host_forbidden"), (code, reason)
        # And nothing was archived or created
        listed = httpx.get(f"{api.base}/sessions", params={"archived": "include"}).json()
        assert [s["sessionId"] for s in listed["sessions"] if s["cwd"].endswith("evil")] == []
        assert httpx.get(f"{api.base}/sessions/{sid}").json()["archived"] is False


@pytest.mark.parametrize(
    "name", ["localhost", "LOCALHOST", "127.0.0.1", "127.8.9.10", "[::1]", "fleet.lan"]
)
def test_loopback_and_listed_names_are_served_as_their_own_origin(
    tmp_path: Path, name: str
) -> None:
    # Given the API with no token and fleet.lan listed in FLEET_API_ALLOWED_HOSTS
    with api_process(tmp_path / "api.log", FLEET_API_ALLOWED_HOSTS="fleet.lan") as api:
        # When a page of http://<name>:<port> creates a session and opens /acp
        resp = httpx.post(
            f"{api.base}/sessions", json={"cwd": "/tmp/fleet-host/own"}, headers=_as(api, name)
        )
        # Then both are served
        assert resp.status_code == 201, resp.text
        seen, code, _reason = _acp_as(api, name)
        assert code is None and '"protocolVersion":1' in seen[0].replace(" ", ""), seen


def test_a_host_without_port_or_that_is_no_host_name(tmp_path: Path) -> None:
    with api_process(tmp_path / "api.log") as api:
        # A loopback name without a port is loopback; garbage is no name of this API
        assert httpx.get(f"{api.base}/sessions", headers={"Host": "localhost"}).status_code == 200
        for host in ("127.0.0.1@rebound.example", "127.0.0.1.rebound.example", "localhost:x"):
            resp = httpx.get(f"{api.base}/sessions", headers={"Host": host})
            error_shape(resp, 403, "host_forbidden")


def test_with_a_token_every_name_is_served(tmp_path: Path) -> None:
    # Given the API with a token (a page of a rebound name cannot have it)
    with api_process(tmp_path / "api.log", FLEET_API_TOKEN="host-token") as api:
        headers = {**_as(api, REBOUND), "Authorization": "Bearer host-token"}
        # When a client names the API by any name, with the token
        resp = httpx.post(f"{api.base}/sessions", json={"cwd": "/tmp/x"}, headers=headers)
        # Then it is served; without the token it is refused 401 as always
        assert resp.status_code == 201, resp.text
        del headers["Authorization"]
        error_shape(httpx.get(f"{api.base}/sessions", headers=headers), 401, "unauthorized")


def _raw(api: ApiProcess, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """Send ``head`` (request line and header lines, ``\\r\\n`` added) and ``body`` on a raw
    socket, as no HTTP library would let a client: (status, JSON body)."""
    request = (head.replace("\n", "\r\n") + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    status_line, _, rest = answer.partition(b"\r\n")
    _headers, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(payload)


def test_a_request_without_a_host_is_refused(tmp_path: Path) -> None:
    # Given the API with no token
    with api_process(tmp_path / "api.log") as api:
        # When a request names no host at all, over HTTP/1.0 and HTTP/1.1
        for version in ("1.0", "1.1"):
            status, body = _raw(api, f"GET /sessions HTTP/{version}\nConnection: close")
            # Then it is refused as a foreign name is
            assert status == 403 and body["error"]["code"] == "host_forbidden", (version, body)
            assert body["error"]["data"] == {"host": None}, body
        # And every client the project ships or tests with names one: the same request served
        status, body = _raw(api, "GET /sessions HTTP/1.0\nHost: 127.0.0.1")
        assert status == 200 and "sessions" in body, body


@pytest.mark.parametrize("host", ["[::1]evil", "[::1].evil.example", "[::1]x:80", "[::1]:8x"])
def test_a_bracketed_address_with_anything_after_it_is_no_host_name(
    tmp_path: Path, host: str
) -> None:
    with api_process(tmp_path / "api.log") as api:
        resp = httpx.get(f"{api.base}/sessions", headers={"Host": host})
        error_shape(resp, 403, "host_forbidden")
        # [::1] with or without a port is still loopback
        for own in ("[::1]", f"[::1]:{api.port}"):
            assert httpx.get(f"{api.base}/sessions", headers={"Host": own}).status_code == 200


@pytest.mark.parametrize("token", [None, "host-token"])
def test_two_host_or_two_origin_headers_are_refused(tmp_path: Path, token: str | None) -> None:
    env = {"FLEET_API_TOKEN": token} if token else {}
    auth = f"\nAuthorization: Bearer {token}" if token else ""
    with api_process(tmp_path / "api.log", **env) as api:
        own = f"127.0.0.1:{api.port}"
        # When a request names a foreign host, then loopback (the last would win)
        status, body = _raw(
            api, f"GET /sessions HTTP/1.1\nHost: evil.example\nHost: {own}{auth}\nConnection: close"
        )
        # Then it is refused 400 whatever the names, token or not
        assert status == 400 and body["error"]["code"] == "duplicate_header", body
        assert body["error"]["data"] == {"header": "host"}, body
        # And so is a write giving Origin twice, a foreign page's then the API's own
        payload = b'{"cwd": "/tmp/fleet-host/two-origins"}'
        status, body = _raw(
            api,
            f"POST /sessions HTTP/1.1\nHost: {own}\nOrigin: http://evil.example\n"
            f"Origin: http://{own}{auth}\nContent-Type: application/json\n"
            f"Content-Length: {len(payload)}\nConnection: close",
            payload,
        )
        assert status == 400 and body["error"]["code"] == "duplicate_header", body
        assert body["error"]["data"] == {"header": "origin"}, body
        # And nothing was created
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        listed = httpx.get(
            f"{api.base}/sessions", params={"cwd": "/tmp/fleet-host/two-origins"}, headers=headers
        )
        assert listed.json()["sessions"] == [], listed.text


def test_an_empty_origin_may_not_change_state(tmp_path: Path) -> None:
    with api_process(tmp_path / "api.log") as api:
        own = f"127.0.0.1:{api.port}"
        payload = b'{"cwd": "/tmp/fleet-host/empty-origin"}'
        for origin in ("Origin: ", "Origin:"):
            # When a write carries an Origin header with nothing in it
            status, body = _raw(
                api,
                f"POST /sessions HTTP/1.1\nHost: {own}\n{origin}\n"
                f"Content-Type: application/json\nContent-Length: {len(payload)}\n"
                "Connection: close",
                payload,
            )
            # Then it is refused as a foreign page's is (no browser sends that)
            assert status == 403 and body["error"]["code"] == "origin_forbidden", body
            assert body["error"]["data"] == {"origin": ""}, body
        # And a read with it is left to the browser
        status, body = _raw(api, f"GET /sessions HTTP/1.1\nHost: {own}\nOrigin:\nConnection: close")
        assert status == 200, body
