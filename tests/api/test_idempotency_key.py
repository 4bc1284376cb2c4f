"""``Idempotency-Key`` on ``POST /sessions`` and ``POST /sessions/{id}/prompt`` (in process,
against the real test Redis): a retry answers what the first request did and creates nothing,
the key with another body is refused, a malformed key is a 400. The retry after a lost reply is
in ``tests/faults/test_lost_write_reply.py``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.session import sessions
from orchestrator.storage.idempotency import MAX_KEY
from orchestrator.storage.store import Store
from tests.api_process import api_process
from tests.helpers import RecordingDispatcher, error_shape, rest_client


@pytest.fixture(scope="module")
def recorder() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture(scope="module")
def client(store: Store, recorder: RecordingDispatcher) -> Iterator[TestClient]:
    with rest_client(store=store, dispatcher=recorder) as c:
        yield c


def _cwd() -> str:
    return f"/tmp/fleet-idem-test/{uuid.uuid4().hex}"


def _key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def test_a_creation_retried_with_its_key_answers_the_same_session(
    client: TestClient, store: Store
) -> None:
    cwd, key = _cwd(), _key()
    first = client.post("/sessions", json={"cwd": cwd, "model": "m1"}, headers=key)
    again = client.post("/sessions", json={"cwd": cwd, "model": "m1"}, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert [s.session_id for s in sessions.list_sessions(store, cwd=cwd).sessions] == [
        first.json()["sessionId"]
    ]


def test_a_creation_without_a_key_creates_each_time(client: TestClient, store: Store) -> None:
    cwd = _cwd()
    assert client.post("/sessions", json={"cwd": cwd}).status_code == 201
    assert client.post("/sessions", json={"cwd": cwd}).status_code == 201
    assert len(sessions.list_sessions(store, cwd=cwd).sessions) == 2


@pytest.mark.parametrize(
    "other", [{"model": "m2"}, {"cwd": "/elsewhere"}, {"parentId": "sess_nosuchparent"}]
)
def test_a_key_sent_with_another_creation_is_refused(
    client: TestClient, store: Store, other: dict[str, str]
) -> None:
    cwd, key = _cwd(), _key()
    assert client.post("/sessions", json={"cwd": cwd}, headers=key).status_code == 201
    resp = client.post("/sessions", json={"cwd": cwd, **other}, headers=key)
    error = error_shape(resp, 422, "idempotency_key_reused")
    assert error["data"] == {"param": "idempotencyKey"}
    assert len(sessions.list_sessions(store, cwd=cwd).sessions) == 1


@pytest.mark.parametrize("bad", ["", "a b", "x" * (MAX_KEY + 1), "tab\tin"])
def test_a_malformed_key_is_a_400_and_creates_nothing(
    client: TestClient, store: Store, bad: str
) -> None:
    cwd = _cwd()
    resp = client.post("/sessions", json={"cwd": cwd}, headers={"Idempotency-Key": bad})
    error = error_shape(resp, 400, "invalid_idempotency_key")
    assert error["data"]["param"] == "idempotencyKey" and error["data"]["max"] == MAX_KEY
    assert sessions.list_sessions(store, cwd=cwd).sessions == []


def test_the_longest_key_is_accepted(client: TestClient) -> None:
    headers = {"Idempotency-Key": "k" * MAX_KEY}
    assert client.post("/sessions", json={"cwd": _cwd()}, headers=headers).status_code == 201


def test_a_prompt_retried_with_its_key_answers_the_same_turn_and_stores_one(
    client: TestClient, store: Store, recorder: RecordingDispatcher
) -> None:
    sid = client.post("/sessions", json={"cwd": _cwd()}).json()["sessionId"]
    key = _key()
    first = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"}, headers=key)
    again = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"}, headers=key)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    tid = first.json()["turnId"]
    assert store.redis.zrange(store.keys.live_turns(sid), 0, -1) == [tid]
    # The retry sends the first step again (the first request may have lost its reply before
    # sending it); the step drops a copy of itself.
    assert [args for name, args, _ in recorder.sent if args[:2] == [sid, tid]] == [
        [sid, tid, 0],
        [sid, tid, 0],
    ]


def test_a_key_sent_with_another_prompt_is_refused(client: TestClient, store: Store) -> None:
    sid = client.post("/sessions", json={"cwd": _cwd()}).json()["sessionId"]
    key = _key()
    assert client.post(f"/sessions/{sid}/prompt", json={"prompt": "a"}, headers=key).is_success
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "b"}, headers=key)
    error_shape(resp, 422, "idempotency_key_reused")
    assert store.redis.zcard(store.keys.live_turns(sid)) == 1


def test_a_prompt_key_is_scoped_to_its_session(client: TestClient) -> None:
    one, two = (client.post("/sessions", json={"cwd": _cwd()}).json()["sessionId"] for _ in "12")
    key = _key()
    a = client.post(f"/sessions/{one}/prompt", json={"prompt": "same"}, headers=key)
    b = client.post(f"/sessions/{two}/prompt", json={"prompt": "same"}, headers=key)
    assert a.status_code == b.status_code == 202
    assert a.json()["turnId"] != b.json()["turnId"]


def test_a_refused_prompt_records_no_key(client: TestClient) -> None:
    sid = client.post("/sessions", json={"cwd": _cwd()}).json()["sessionId"]
    assert client.post(f"/sessions/{sid}/archive", json={}).status_code == 200
    key = _key()
    refused = client.post(f"/sessions/{sid}/prompt", json={"prompt": "x"}, headers=key)
    error_shape(refused, 409, "session_archived")
    assert client.post(f"/sessions/{sid}/unarchive", json={}).status_code == 200
    # Nothing was recorded with the refusal: the retry is judged afresh.
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "x"}, headers=key)
    assert resp.status_code == 202, resp.text


def test_the_key_is_kept_for_the_configured_time(store_with: object) -> None:
    store = store_with(idempotency_ttl_seconds=5)  # type: ignore[operator]
    made = sessions.create_session(store, _cwd(), idempotency_key="ttl-key")
    [name] = [
        k
        for k in store.redis.scan_iter(match=f"{store.keys.prefix}idem:sessions:*", count=1000)
        if store.redis.hget(k, "id") == made.session_id
    ]
    assert 0 < store.redis.pttl(name) <= 5000


def test_the_openapi_document_describes_the_header(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/sessions", "/sessions/{session_id}/prompt"):
        [header] = [p for p in paths[path]["post"]["parameters"] if p["name"] == "Idempotency-Key"]
        assert header["in"] == "header" and not header.get("required", False)
        assert "retry" in header["description"]
        answers = paths[path]["post"]["responses"]
        assert "write_outcome_unknown" in answers["503"]["description"]
        assert "idempotency_key_reused" in answers["422"]["description"]


def test_a_key_given_twice_is_refused_and_starts_nothing(
    client: TestClient, store: Store, recorder: RecordingDispatcher
) -> None:
    cwd = _cwd()
    one, two = str(uuid.uuid4()), str(uuid.uuid4())
    twice = [("Idempotency-Key", one), ("Idempotency-Key", two)]
    # A creation giving two keys is refused, naming the header twice, and creates nothing
    resp = client.post("/sessions", json={"cwd": cwd}, headers=twice)
    error = error_shape(resp, 400, "invalid_idempotency_key")
    assert "more than once" in error["message"], error
    assert error["data"] == {"param": "idempotencyKey"}, error
    assert sessions.list_sessions(store, cwd=cwd).sessions == []
    # And so is a prompt: no turn starts
    sid = client.post("/sessions", json={"cwd": cwd}).json()["sessionId"]
    sent = len(recorder.sent)
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "hi"}, headers=twice)
    error_shape(resp, 400, "invalid_idempotency_key")
    assert len(recorder.sent) == sent
    # And neither key was recorded: each alone creates afresh
    first = client.post("/sessions", json={"cwd": cwd}, headers={"Idempotency-Key": one})
    assert first.status_code == 201 and first.json()["sessionId"] != sid


def test_a_real_server_refuses_a_key_given_twice(tmp_path: Path) -> None:
    cwd = _cwd()
    with api_process(tmp_path / "api.log") as api:
        headers = [("Idempotency-Key", str(uuid.uuid4())), ("Idempotency-Key", "x2")]
        resp = httpx.post(f"{api.base}/sessions", json={"cwd": cwd}, headers=headers)
        error_shape(resp, 400, "invalid_idempotency_key")
        listed = httpx.get(f"{api.base}/sessions", params={"cwd": cwd}).json()
        assert listed["sessions"] == []
