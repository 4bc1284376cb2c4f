"""Bad input and access: ids, cursors and titles never reach a Redis key name unvalidated, and
request bodies, prompts, titles and JSON-RPC messages have size limits with clear errors.

Key injection: ids such as ``a:b``, ``*``, ``sess_x\\n``, ``../``, very long ids, unicode and
cursors embedding key-ish strings are sent through REST, ACP and the CLI. Each answer must be a
clear not-found or invalid error, and afterwards no key of this run's prefix (and no audit or
event entry) may contain the probes' marker: had an id reached a key name, a key (or a record
of it) would carry it.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import api.guards
import api.rest
from api.acp import MAX_MESSAGE
from api.cli import app as cli_app
from orchestrator.session import titles
from orchestrator.settings import FleetSettings
from orchestrator.turn import turns
from tests.fuzz.test_acp_fuzz import Harness
from tests.helpers import RecordingDispatcher

pytestmark = pytest.mark.redis

#: Unique to this run: any key, audit or event entry holding it came from a probe.
MARK = "zq" + uuid.uuid4().hex[:10]
PROBES = [
    f"{MARK}a:b",
    f"{MARK}*",
    f"{MARK}?[ab]",
    f"sess_{MARK}\n",
    f"sess_{MARK}\r\nDEL x",
    f"../{MARK}",
    f"{MARK}/../../x",
    f"{MARK}" + "x" * 70,
    f"{MARK}" + "y" * 10_000,
    f"{MARK}séance",
    f"{MARK}\u202e",
    f"{MARK}\x00",
    f"{MARK} space",
    f"{MARK}%2F",
    f"session:{MARK}",
    f"{MARK}{{tag}}",
]
NOT_FOUND_OR_INVALID = {404, 422}


def _cursor(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


CURSORS = [
    f"{MARK}:*",
    f"session:{MARK}",
    _cursor({"a": "exclude", "c": None, "s": 1e15, "i": f"session:{MARK}*"}),
    _cursor({"a": "exclude", "c": None, "s": 1e15, "i": f"../{MARK}\n"}),
    _cursor({"a": "exclude", "c": f"/{MARK}", "s": 1, "i": MARK}),
    _cursor({"a": "exclude", "c": None, "s": "1", "i": MARK}),
    _cursor({"a": "exclude", "c": None, "s": 1, "i": [MARK]}),
    "=" * 9000,
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEET_API_TOKEN", raising=False)
        app = api.rest.create_app(FleetSettings(), dispatcher=RecordingDispatcher())
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


def _clear_error(resp: httpx.Response, statuses: set[int] = NOT_FOUND_OR_INVALID) -> None:
    assert resp.status_code in statuses, f"{resp.request.url}: {resp.status_code} {resp.text}"
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "data"}, body
    assert body["error"]["message"].strip(), body
    assert body["error"]["message"] != "Internal Server Error", body


def _session(client: TestClient) -> str:
    resp = client.post("/sessions", json={"cwd": f"/tmp/fleet-bad-input/{uuid.uuid4().hex}"})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["sessionId"]
    return sid


# -- key injection ---------------------------------------------------------------------------


def test_rest_rejects_probe_ids(client: TestClient) -> None:
    sent = 0
    for probe in PROBES:
        p = quote(probe, safe="")
        calls = [
            ("GET", f"/sessions/{p}", None),
            ("DELETE", f"/sessions/{p}", None),
            ("GET", f"/sessions/{p}/activity", None),
            ("GET", f"/sessions/{p}/audit", None),
            ("POST", f"/sessions/{p}/prompt", {"prompt": "hi"}),
            ("POST", f"/sessions/{p}/archive", {"stopActivity": True}),
            ("POST", f"/sessions/{p}/unarchive", None),
            ("PUT", f"/sessions/{p}/title", {"title": "t"}),
            ("POST", f"/sessions/{p}/close", None),
            ("POST", f"/sessions/{p}/cancel", None),
            ("GET", f"/turns/{p}", None),
        ]
        for method, url, body in calls:
            resp = client.request(method, url, json=body)
            sent += 1
            if method == "DELETE" and resp.status_code == 200:
                # Delete is idempotent: a malformed id names nothing, so nothing is deleted.
                assert resp.json()["deleted"] is False, resp.text
                continue
            _clear_error(resp)
        # As a parent, a query value or a body field.
        resp = client.post("/sessions", json={"cwd": "/tmp/fleet-bad-input", "parentId": probe})
        _clear_error(resp)
        resp = client.get("/events", params={"sessionId": probe})
        _clear_error(resp, {422})
        sent += 2
    resp = client.post("/sessions/archive", json={"sessionIds": PROBES, "stopActivity": True})
    assert resp.status_code == 200, resp.text
    outcomes = {r["sessionId"]: r["outcome"] for r in resp.json()["results"]}
    assert set(outcomes.values()) == {"not_found"}, outcomes
    print(f"\nkey injection: {sent + 1} REST requests with probe ids")


def test_rest_rejects_keyish_cursors(client: TestClient) -> None:
    for cursor in CURSORS:
        resp = client.get("/sessions", params={"cursor": cursor})
        # A well-formed cursor whose id is key-ish is only compared with index members.
        if resp.status_code == 200:
            assert isinstance(resp.json()["sessions"], list)
            continue
        _clear_error(resp, {422})
    for before in (f"{MARK}:*", "1-1:x", "+", "-", f"({MARK}"):
        _clear_error(client.get("/audit", params={"before": before}), {422})
        _clear_error(client.get("/events", params={"lastEventId": before}), {422})
        _clear_error(client.get("/events", headers={"Last-Event-ID": before}), {422})


def test_acp_rejects_probe_ids(store: Any, redis_url: str) -> None:
    harness = Harness(store, redis_url)
    methods = [
        "session/load",
        "session/resume",
        "session/close",
        "session/delete",
        "session/archive",
        "session/unarchive",
        "session/set_title",
        "session/prompt",
        "_agentFleet/activity",
    ]
    sent = 0
    try:
        for probe in PROBES:
            for method in methods:
                params = {
                    "sessionId": probe,
                    "mcpServers": [],
                    "title": "t",
                    "prompt": [{"type": "text", "text": "hi"}],
                }
                msg = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
                answers = harness.run(json.dumps(msg), expect_id=7)
                sent += 1
                answer = next(m for m in answers if m.get("id") == 7)
                if method == "session/delete":
                    assert answer.get("result") == {}, answer  # idempotent: nothing deleted
                    continue
                assert answer["error"]["code"] in (-32002, -32602), answer
                assert answer["error"]["message"].strip(), answer
            for note in ("session/cancel",):
                harness.run(json.dumps({"jsonrpc": "2.0", "method": note, "params": params}))
                sent += 1
            answers = harness.run(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 8,
                        "method": "session/new",
                        "params": {"cwd": f"/tmp/{probe}", "mcpServers": []},
                    }
                )
            )
            sent += 1
        for cursor in CURSORS:
            msg = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "session/list",
                "params": {"cursor": cursor},
            }
            answer = next(m for m in harness.run(json.dumps(msg)) if m.get("id") == 9)
            sent += 1
            assert "result" in answer or answer["error"]["code"] == -32602, answer
    finally:
        harness.close()
    print(f"\nkey injection: {sent} ACP messages with probe ids and cursors")


def test_cli_rejects_probe_ids() -> None:
    runner = CliRunner()
    ran = 0
    for probe in PROBES:
        if "\x00" in probe:
            continue  # argv cannot carry a NUL byte
        for args in (
            ["activity", probe],
            ["archive", probe, "--stop"],
            ["unarchive", probe],
            ["audit", probe],
            ["prompt", probe, "hi"],
            ["sessions", "new", "/tmp/fleet-bad-input", "--parent", probe],
        ):
            result = runner.invoke(cli_app, args)
            ran += 1
            assert "Traceback" not in result.output, result.output
            assert result.exit_code == 2, (args, result.exit_code, result.output)
            assert "not found" in result.output.lower() or "error" in result.output.lower()
        result = runner.invoke(cli_app, ["archive", "--bulk", probe, "--json"])
        ran += 1
        assert result.exit_code == 1, (result.exit_code, result.output)
    print(f"\nkey injection: {ran} CLI commands with probe ids")


def test_no_key_or_record_carries_a_probe(
    client: TestClient, store: Any, redis_url: str, key_prefix: str
) -> None:
    """Run last in this module (pytest keeps file order): after every probe above."""
    r = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        keys = list(r.scan_iter(match=f"{key_prefix}*".encode(), count=1000))
        assert keys, "the scan found none of this run's keys"
        marked = [k for k in keys if MARK.encode() in k]
        assert not marked, marked[:10]
        odd = [k for k in keys if any(c in k for c in (b"\n", b"\r", b"*", b"..", b" "))]
        assert not odd, odd[:10]
        assert all(k.isascii() for k in keys), [k for k in keys if not k.isascii()][:10]
        for stream in (store.keys.audit_all, store.keys.event_stream):
            entries: Any = r.xrange(stream.encode(), "-", "+")
            for _id, fields in entries:
                assert not any(MARK.encode() in value for value in fields.values()), fields
    finally:
        r.close()


# -- size limits -----------------------------------------------------------------------------


@pytest.fixture
def small_cap() -> int:
    return 2000


@pytest.fixture
def capped(small_cap: int) -> Iterator[TestClient]:
    """The app built with a body cap of ``small_cap`` bytes."""
    settings = FleetSettings(api_token="")
    app = api.rest.create_app(settings, dispatcher=RecordingDispatcher(), max_body_bytes=small_cap)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _too_large(resp: httpx.Response, cap: int) -> None:
    assert resp.status_code == 413, resp.text
    body = resp.json()
    assert body["error"]["code"] == "body_too_large", body
    assert str(cap) in body["error"]["message"], body
    assert body["error"]["data"] == {"maxBytes": cap}, body


def test_body_cap_default_is_one_mib(client: TestClient) -> None:
    assert api.guards.MAX_BODY_BYTES == 1_048_576
    big = {"cwd": "/tmp/" + "a" * 1_048_576}
    _too_large(client.post("/sessions", json=big), 1_048_576)


def test_body_cap_with_content_length(capped: TestClient, small_cap: int) -> None:
    sid = _session(capped)
    _too_large(capped.post(f"/sessions/{sid}/prompt", json={"prompt": "a" * 3000}), small_cap)
    _too_large(capped.put(f"/sessions/{sid}/title", json={"title": "a" * 3000}), small_cap)
    # Within the cap: served as usual.
    resp = capped.put(f"/sessions/{sid}/title", json={"title": "a" * 1000})
    assert resp.status_code == 200, resp.text


def test_body_cap_without_content_length(capped: TestClient, small_cap: int) -> None:
    """A chunked body (no Content-Length) is counted as it is read."""
    sid = _session(capped)

    def chunks(n: int) -> Iterator[bytes]:
        yield b'{"title": "'
        for _ in range(n):
            yield b"a" * 500
        yield b'"}'

    resp = capped.put(f"/sessions/{sid}/title", content=chunks(10))
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    _too_large(resp, small_cap)
    resp = capped.put(
        f"/sessions/{sid}/title", content=chunks(2), headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["title"] == "a" * titles.MAX_TITLE_GRAPHEMES


def test_prompt_and_title_caps_are_clear(client: TestClient) -> None:
    sid = _session(client)
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "a" * (turns.MAX_PROMPT + 1)})
    _clear_error(resp, {422})
    assert str(turns.MAX_PROMPT) in resp.json()["error"]["message"], resp.text
    resp = client.put(f"/sessions/{sid}/title", json={"title": "a" * (titles.MAX_TITLE_INPUT + 1)})
    _clear_error(resp, {422})
    assert str(titles.MAX_TITLE_INPUT) in resp.json()["error"]["message"], resp.text
    resp = client.get("/sessions", params={"q": "a" * 201})
    _clear_error(resp, {422})


def test_acp_caps_are_clear(store: Any, redis_url: str, client: TestClient) -> None:
    sid = _session(client)
    harness = Harness(store, redis_url)
    try:
        cases = [
            (
                "session/prompt",
                {
                    "sessionId": sid,
                    "prompt": [{"type": "text", "text": "a" * (turns.MAX_PROMPT + 1)}],
                },
                str(turns.MAX_PROMPT),
            ),
            (
                "session/set_title",
                {"sessionId": sid, "title": "a" * (titles.MAX_TITLE_INPUT + 1)},
                str(titles.MAX_TITLE_INPUT),
            ),
        ]
        for method, params, figure in cases:
            msg = {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}
            sent = harness.run(json.dumps(msg), expect_id=3)
            answer = next(m for m in sent if m.get("id") == 3)
            assert answer["error"]["code"] == -32602, answer
            assert figure in answer["error"]["message"], answer
        text = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "x", "params": "a" * MAX_MESSAGE})
        answer = harness.run(text)[0]
        assert answer["id"] is None and answer["error"]["code"] == -32600, answer
        assert str(MAX_MESSAGE) in answer["error"]["message"], answer
    finally:
        harness.close()
